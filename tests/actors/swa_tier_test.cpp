// The SWA-cache tier across machines, in one process over a real libfabric transport
// (tcp;ofi_rxm on loopback, one endpoint per "machine"): the directory as plain state
// (deepest key, never the asker's own store, evictions, full reports replacing a node's
// keys, a dead store's keys dropped); then the actors: a store reports to the directory it
// finds in the membership, another machine's fetcher gets the slot byte-exact through the
// transport, a killed holder is a miss (the engine replays), and a directory killed and
// restarted is rebuilt from the stores' full reports so fetches hit again.
#include <doctest/doctest.h>

#include <chrono>
#include <map>
#include <optional>
#include <thread>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/response_promise.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include "actors/swa_tier.hpp"
#include "runtime/engine/engine.hpp"
#include "tests/support/tiny_models.hpp"
#include "transport/fabric_transport.hpp"

using namespace shoal;
using namespace std::chrono_literals;
using runtime::block_key;

namespace {

struct swa_config : caf::actor_system_config {
  swa_config() {
    actors::add_message_types(*this);
    set("scheduler.max-threads", size_t{2});
  }
};

caf::behavior idle(caf::event_based_actor*) {
  return {[](caf::ok_atom) {}};
}

std::shared_ptr<runtime::transport> fabric() {
  auto t = transport::fabric_transport::create({"tcp;ofi_rxm", "127.0.0.1"});
  REQUIRE_MESSAGE(t, (t ? "" : t.error()));
  return std::shared_ptr<runtime::transport>(std::move(*t));
}

actors::membership with_directory(caf::actor dir) {
  actors::membership m;
  m.version = 1;
  actors::node_info n;
  n.name = "dir";
  n.roles = {"directory"};
  n.swa_directory = std::move(dir);
  m.nodes.push_back(n);
  return m;
}

// A store that accepts every request and never replies (it keeps the promises, unanswered).
caf::actor silent_store(caf::actor_system& sys) {
  return sys.spawn([](caf::event_based_actor* self) -> caf::behavior {
    auto held = std::make_shared<std::vector<caf::response_promise>>();
    return {[self, held](swa_atom, get_atom, const runtime::block_key&) {
      auto rp = self->make_response_promise();
      held->push_back(rp);
      return rp;
    }};
  });
}

// Returns once `dir` has handled every message sent to it before (its mailbox is one queue):
// a report sent just before is in its state, no sleep needed.
void sync(caf::actor_system& sys, const actors::swa_directory_actor& dir) {
  caf::scoped_actor self{sys};
  bool answered = false;
  self->request(dir, 10s, stats_atom_v).receive([&](const actors::swa_directory_stats&) { answered = true; },
                                                [&](caf::error&) {});
  REQUIRE(answered);
}

// Polls `f` (a fetch started anew each time) until its result satisfies `ok`, for ≤ 10 s.
template <class Start, class Ok>
std::shared_ptr<runtime::slot_fetch> fetch_until(Start start, Ok ok) {
  std::shared_ptr<runtime::slot_fetch> f;
  for (int i = 0; i < 200; ++i) {
    f = start();
    f->wait();
    if (ok(*f)) break;
    std::this_thread::sleep_for(50ms);
  }
  return f;
}

}  // namespace

TEST_CASE("SWA directory state: deepest key, not the asker's, evictions, full reports, dead stores") {
  swa_config cfg;
  caf::actor_system sys{cfg};
  caf::actor a = sys.spawn(idle), b = sys.spawn(idle), b2 = sys.spawn(idle);
  actors::swa_directory_state d;
  block_key k1{1, 1}, k2{2, 2}, k3{3, 3};
  d.apply({"node-a", a, false, {k1, k2}, {}});
  d.apply({"node-b", b, false, {k3}, {}});
  auto h = d.lookup({k1, k2, k3}, "node-x");
  CHECK(h.index == 2);
  CHECK(h.node == "node-b");
  h = d.lookup({k1, k2, k3}, "node-b");  // never its own store
  CHECK(h.index == 1);
  CHECK(h.node == "node-a");
  d.apply({"node-a", a, false, {}, {k2}});
  CHECK(d.lookup({k1, k2}, "node-x").index == 0);
  // A restarted node (a new store) replaces the old one's keys with its report.
  d.apply({"node-b", b2, true, {k2}, {}});
  CHECK(d.lookup({k3}, "node-x").index == -1);
  h = d.lookup({k1, k2}, "node-x");
  CHECK(h.index == 1);
  CHECK(h.store == b2);
  d.drop(b2.address());
  CHECK(d.lookup({k1, k2}, "node-x").index == 0);
  auto s = d.stats();
  CHECK(s.entries == 1);
  REQUIRE(s.nodes.size() == 1);
  CHECK(s.nodes[0] == "node-a");
  CHECK(s.lookups == 6);
  CHECK(s.full_reports == 1);
  for (auto& x : {a, b, b2}) caf::anon_send_exit(x, caf::exit_reason::user_shutdown);
}

TEST_CASE("SWA tier actors: a slot fetched from another machine over libfabric, holder death, directory restart") {
  swa_config cfg;
  caf::actor_system sys{cfg};
  auto ta = fabric(), tb = fabric();
  auto store_a = std::make_shared<runtime::swa_store>(4, 4096);
  std::vector<uint8_t> slot(3000);
  for (size_t i = 0; i < slot.size(); ++i) slot[i] = static_cast<uint8_t>(i * 37 + 11);
  block_key k1{10, 1}, k2{20, 2}, k3{30, 3};
  store_a->put(k2, 64, slot);

  auto fetcher = std::make_shared<actors::swa_fetcher>(sys, tb, "node-b", 2000ms);
  auto a = actors::spawn_swa_store(sys, {"node-a", store_a, ta, nullptr, 50ms});
  REQUIRE_MESSAGE(a, (a ? "" : a.error()));
  auto dir = actors::spawn_swa_directory(sys);
  caf::anon_send(*a, with_directory(caf::actor_cast<caf::actor>(dir)));
  fetcher->set_directory(caf::actor_cast<caf::actor>(dir));

  auto start = [&] { return fetcher->start_fetch({k1, k2, k3}, 4096); };
  auto f = fetch_until(start, [](const runtime::slot_fetch& x) { return x.index() >= 0; });
  REQUIRE(f->error() == "");
  CHECK(f->index() == 1);
  CHECK(f->bytes() == slot);

  // A slot added later reaches the directory with the next report.
  std::vector<uint8_t> deeper(100, 7);
  store_a->put(k3, 96, deeper);
  f = fetch_until(start, [](const runtime::slot_fetch& x) { return x.index() == 2; });
  CHECK(f->index() == 2);
  CHECK(f->bytes() == deeper);

  // The directory is killed and a new one started: the store reports everything to it.
  caf::anon_send_exit(dir, caf::exit_reason::kill);
  f = fetch_until(start, [](const runtime::slot_fetch& x) { return !x.error().empty(); });
  CHECK(f->index() == -1);  // the dead directory: an error, never a hang
  auto dir2 = actors::spawn_swa_directory(sys);
  fetcher->set_directory(caf::actor_cast<caf::actor>(dir2));
  caf::anon_send(*a, with_directory(caf::actor_cast<caf::actor>(dir2)));
  f = fetch_until(start, [](const runtime::slot_fetch& x) { return x.index() == 2; });
  CHECK(f->index() == 2);
  CHECK(f->bytes() == deeper);
  {
    caf::scoped_actor self{sys};
    self->request(dir2, 5s, stats_atom_v)
      .receive([&](const actors::swa_directory_stats& s) {
                 CHECK(s.entries == 2);
                 CHECK(s.full_reports == 1);
               },
               [&](caf::error& e) { FAIL(sys.render(e)); });
  }

  // The holder dies: the directory drops its keys, the fetch is a miss.
  caf::anon_send_exit(*a, caf::exit_reason::kill);
  f = fetch_until(start, [](const runtime::slot_fetch& x) { return x.index() == -1 && x.error().empty(); });
  CHECK(f->index() == -1);
  CHECK(f->error() == "");
  caf::anon_send_exit(dir2, caf::exit_reason::user_shutdown);
}

TEST_CASE("SWA tier actors: a holder that takes the request and never answers fails the fetch at the timeout") {
  swa_config cfg;
  caf::actor_system sys{cfg};
  auto silent = silent_store(sys);
  auto dir = actors::spawn_swa_directory(sys);
  block_key k{7, 7};
  caf::anon_send(dir, actors::swa_report{"node-q", silent, true, {k}, {}});
  auto fetcher = std::make_shared<actors::swa_fetcher>(sys, fabric(), "node-b", 500ms);
  fetcher->set_directory(caf::actor_cast<caf::actor>(dir));
  sync(sys, dir);
  const auto t0 = std::chrono::steady_clock::now();
  auto f = fetcher->start_fetch({k}, 4096);
  f->wait();  // ends (the case's ctest timeout would catch a hang), and not before the deadline
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(f->index() == -1);
  CHECK(f->error().find("node-q") != std::string::npos);
  CHECK(took >= 0.4);  // the 500 ms deadline, less timer slack
  caf::anon_send_exit(silent, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(dir, caf::exit_reason::user_shutdown);
}

TEST_CASE("SWA tier: an engine whose slot holder never answers keeps serving its other requests, the waiting one replays") {
  swa_config cfg;
  caf::actor_system sys{cfg};
  auto silent = silent_store(sys);
  auto w = test::tiny_model("tiny");
  const int64_t bs = w->config.block_size;
  auto shared = test::random_tokens(96, 91);
  auto waiting_prompt = shared;
  for (int32_t t : test::random_tokens(40, 92)) waiting_prompt.push_back(t);  // past the decoder tail
  auto other_prompt = test::random_tokens(70, 93);
  // The holder claims the slot at the end of the shared prefix.
  auto dir = actors::spawn_swa_directory(sys);
  auto keys = runtime::chain_keys(shared, static_cast<int>(bs));
  caf::anon_send(dir, actors::swa_report{"node-q", silent, true, {keys.back()}, {}});
  auto fetcher = std::make_shared<actors::swa_fetcher>(sys, fabric(), "node-b", 5000ms);
  fetcher->set_directory(caf::actor_cast<caf::actor>(dir));
  sync(sys, dir);

  // No slots kept here (every hit would replay): the shared prefix is a local block hit only.
  auto base = test::exact_engine_config(256);
  base.cache.swa_snapshots = 0;
  runtime::engine replayer(w, base), cold(w, base);
  runtime::sampling_params p;
  p.max_tokens = 6;
  p.ignore_eos = true;
  test::run_alone(replayer, shared, p);
  auto ref_waiting = test::run_alone(replayer, waiting_prompt, p);
  REQUIRE(replayer.stats().cache.replays == 1);
  auto ref_other = test::run_alone(cold, other_prompt, p);

  auto rcfg = base;
  rcfg.cache.swa_remote = fetcher;
  rcfg.cache.swa_timeout_s = 2.0;  // room for the other request on a loaded machine
  runtime::engine e(w, rcfg);
  test::run_alone(e, shared, p);
  const auto t0 = std::chrono::steady_clock::now();
  auto waiting = e.add_request(waiting_prompt, p);
  auto other = e.add_request(other_prompt, p);
  REQUIRE(waiting);
  REQUIRE(other);
  std::map<int64_t, std::vector<runtime::token_event>> events;
  // When the other request finished: had the waiting one produced a token, or given up yet?
  std::optional<size_t> waiting_events_then;
  std::optional<uint64_t> timeouts_then;
  double other_done_s = -1;
  while (e.has_work() && std::chrono::steady_clock::now() - t0 < 20s) {
    for (auto& ev : e.step()) {
      if (ev.id == *other && ev.finished) {
        other_done_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        waiting_events_then = events[waiting->value].size();
        timeouts_then = e.stats().cache.swa_fetch_timeouts;
      }
      events[ev.id.value].push_back(std::move(ev));
    }
    if (e.stalled()) std::this_thread::sleep_for(1ms);
  }
  const double waited_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // The other request finished while the waiting one still waited on the silent holder (no
  // token yet, its fetch not yet given up): an order of events, not a wall-clock bound.
  REQUIRE(waiting_events_then.has_value());
  CHECK(*waiting_events_then == 0);
  CHECK(*timeouts_then == 0);
  CHECK(waited_s >= 2.0);  // the engine's 2 s fetch timeout is honoured, never cut short
  REQUIRE(events[waiting->value].size() == ref_waiting.size());
  for (size_t i = 0; i < ref_waiting.size(); ++i) CHECK(events[waiting->value][i].logits == ref_waiting[i].logits);
  REQUIRE(events[other->value].size() == ref_other.size());
  for (size_t i = 0; i < ref_other.size(); ++i) CHECK(events[other->value][i].logits == ref_other[i].logits);
  auto st = e.stats().cache;
  CHECK(st.swa_lookups == 1);  // the shared prefix had no hit to ask about
  CHECK(st.swa_fetch_timeouts == 1);
  CHECK(st.replays == 1);
  MESSAGE("other request done at " << other_done_s << " s, the waiting one at " << waited_s << " s");
  fetcher.reset();  // its reader waits out the silent holder (≤ 5 s) before the system goes
  caf::anon_send_exit(silent, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(dir, caf::exit_reason::user_shutdown);
}
