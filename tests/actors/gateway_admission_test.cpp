// The gateway's one bound on requests in flight (gateway_config::max_in_flight), shared by the
// HTTP connections and the actor path (submit, as the shell uses it): 4x the bound at once is
// served or refused with a clear error (HTTP 429 naming the limit, errc::too_many_requests),
// and the process's thread count stays bounded throughout.
#include <doctest/doctest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <thread>
#include <vector>

#include "tests/actors/gateway_harness.hpp"

using namespace shoal;
using namespace shoal::test::gateway_harness;
using namespace std::chrono_literals;

namespace {

constexpr int bound = 4;

int64_t thread_count() {
  int64_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

// A TCP connection to the gateway that sends nothing: it holds one admission slot (its
// connection thread waits for a request) until closed.
struct idle_connection {
  int fd = -1;
  explicit idle_connection(uint16_t port) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  }
  ~idle_connection() { ::close(fd); }
  idle_connection(const idle_connection&) = delete;
  idle_connection& operator=(const idle_connection&) = delete;
};

bool refused_429(const actors::http_response& r) {
  if (r.status != 429) return false;
  json j = parse(r.body);
  return j["error"]["type"] == "rate_limit_error" &&
         j["error"]["message"].get<std::string>().find("limit " + std::to_string(bound)) != std::string::npos;
}

// Samples the process's thread count until stopped; the peak it saw.
struct thread_watch {
  std::atomic<bool> stop{false};
  std::atomic<int64_t> peak{0};
  std::thread t{[this] {
    while (!stop) {
      peak = std::max(peak.load(), thread_count());
      std::this_thread::sleep_for(1ms);
    }
  }};
  int64_t finish() {
    stop = true;
    t.join();
    return peak;
  }
};

}  // namespace

TEST_CASE("gateway: 4x its in-flight bound at once, over HTTP and the actor path, is served or refused with a reason, and threads stay bounded") {
  cluster c(1);
  auto g = cluster::default_gateway();
  g.max_in_flight = bound;
  const uint16_t port = c.start_gateway(g);
  const actors::gateway_actor gw = c.gateways.back().actor;
  caf::scoped_actor client{c.sys}, sink{c.sys};
  const auto submit = [&](int n) {  // n submits at once; (admitted ids, refusals naming the limit)
    for (int i = 0; i < n; ++i)
      client->send(caf::actor_cast<caf::actor>(gw), submit_atom_v, std::string("admission ") + std::to_string(i),
                   int32_t{24}, caf::actor_cast<caf::actor>(sink));
    std::pair<std::vector<request_id>, int> out{{}, 0};
    for (int i = 0; i < n; ++i)
      client->receive([&](request_id id) { out.first.push_back(id); },
                      [&](caf::error& e) {
                        auto r = actors::to_error_reply(e);
                        CHECK_MESSAGE(r.code == actors::errc::too_many_requests, r.message);
                        CHECK(r.message.find("limit " + std::to_string(bound)) != std::string::npos);
                        ++out.second;
                      },
                      caf::after(wait_timeout) >> [&] { FAIL("no answer to a submit"); });
    return out;
  };
  const auto wait_finished = [&](size_t n) {  // the final text_event of n admitted submits
    for (size_t done = 0; done < n;)
      sink->receive([&](const actors::text_event& e) { done += e.finished ? 1 : 0; },
                    caf::after(wait_timeout) >> [&] { FAIL("a submitted request did not finish"); });
  };

  SUBCASE("the bound full of idle connections: everything more is refused, then served once they close") {
    std::vector<std::unique_ptr<idle_connection>> idle;
    for (int i = 0; i < bound; ++i) idle.push_back(std::make_unique<idle_connection>(port));
    // The accept loop takes connections in the order their handshakes completed: the four idle
    // ones hold the four slots before the next connection is looked at.
    REQUIRE(refused_429(call(port, "GET", "/v1/models")));
    std::vector<actors::http_response> got(3 * bound);
    std::vector<std::thread> clients;
    for (size_t i = 0; i < got.size(); ++i)
      clients.emplace_back([&, i] { got[i] = post(port, "/v1/completions", completion_body("over the bound", 8)); });
    for (auto& t : clients) t.join();
    for (const auto& r : got) CHECK_MESSAGE(refused_429(r), r.status << " " << r.body);
    const auto [ids, refused] = submit(4 * bound);
    CHECK(ids.empty());
    CHECK(refused == 4 * bound);
    idle.clear();
    // Each idle connection's thread gives its slot back once it reads the close: no event of the
    // gateway's tells the test when, so it asks again for a while.
    bool served = false;
    for (int i = 0; i < 200 && !served; ++i) {
      served = post(port, "/v1/completions", completion_body("after the idle ones closed", 8)).status == 200;
      if (!served) std::this_thread::sleep_for(10ms);
    }
    CHECK(served);
  }

  SUBCASE("a burst of 4x the bound through HTTP and through the actor at once") {
    // Warm: the engine's compute threads and kernel pools exist before the count is taken.
    REQUIRE(post(port, "/v1/completions", completion_body("warm up", 4)).status == 200);
    const int64_t before = thread_count();
    const int http_clients = 4 * bound;
    thread_watch watch;
    std::vector<actors::http_response> got(http_clients);
    std::vector<std::thread> clients;
    for (int i = 0; i < http_clients; ++i)
      clients.emplace_back([&, i] { got[i] = post(port, "/v1/completions", completion_body("burst " + std::to_string(i), 24)); });
    const auto [ids, refused] = submit(4 * bound);
    for (auto& t : clients) t.join();
    wait_finished(ids.size());
    const int64_t peak = watch.finish();
    int ok = 0, too_many = 0;
    for (const auto& r : got) {
      if (r.status == 200) ++ok;
      else CHECK_MESSAGE(refused_429(r), r.status << " " << r.body);
      too_many += r.status == 429;
    }
    MESSAGE("HTTP: " << ok << " served, " << too_many << " refused; actor: " << ids.size() << " served, " << refused
                     << " refused; threads " << before << " before, peak " << peak);
    CHECK(ok + too_many == http_clients);
    CHECK(static_cast<int>(ids.size()) + refused == 4 * bound);
    CHECK(ok + static_cast<int>(ids.size()) >= 1);
    // The test's own client threads and watcher, plus at most `bound` request threads (HTTP
    // connections and submit pumps together) and the accept loop's slack: a thread per request
    // would reach `before + http_clients + 1 + 2 * 4 * bound`.
    CHECK(peak <= before + http_clients + 1 + bound + 2);
  }
}
