// The relay protocol (runtime/core/relay.hpp) and the prefill side's handoff leases
// (handoff_leases.hpp) driven by hand: what the relay asks its host for, in
// order, on the normal path, on re-routes, on handoff placement and on stale answers.
#include <doctest/doctest.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/handoff_leases.hpp"
#include "runtime/core/relay.hpp"

using namespace shoal;
using namespace shoal::runtime;

namespace {

// Records every host call as a line of text.
struct recording_host final : relay_host {
  std::vector<std::string> log;
  std::string ids(std::span<const engine_id> v) {
    std::string s;
    for (engine_id e : v) s += (s.empty() ? "" : ",") + std::to_string(e.value);
    return s;
  }
  void encode_images() override { log.push_back("encode"); }
  void route(std::span<const engine_id> ex) override { log.push_back("route[" + ids(ex) + "]"); }
  void submit(engine_id e, int64_t resume) override {
    log.push_back("submit " + std::to_string(e.value) + (resume ? " after " + std::to_string(resume) : ""));
  }
  void watch(engine_id e) override { log.push_back("watch " + std::to_string(e.value)); }
  void unwatch(engine_id e) override { log.push_back("unwatch " + std::to_string(e.value)); }
  void release_prefill() override { log.push_back("release_prefill"); }
  void release_decode() override { log.push_back("release_decode"); }
  void retry_after(double s) override { log.push_back("retry_after " + std::to_string(static_cast<int>(s * 1000))); }
  void route_decode(uint64_t p, std::span<const engine_id> r) override {
    log.push_back("route_decode " + std::to_string(p) + "[" + ids(r) + "]");
  }
  void offer_to(engine_id d, uint64_t p) override {
    log.push_back("offer_to " + std::to_string(d.value) + " " + std::to_string(p));
  }
  void tell_placed(engine_id e, bool placed) override {
    log.push_back("placed " + std::to_string(e.value) + " " + (placed ? "yes" : "no"));
  }
  void cancel_at(engine_id e) override { log.push_back("cancel " + std::to_string(e.value)); }
  void fail(const relay_error& err) override { log.push_back("fail: " + err.message); }
  std::vector<std::string> take() { return std::exchange(log, {}); }
};

using lines = std::vector<std::string>;

}  // namespace

TEST_CASE("relay: route, submit, forward every token, finish once") {
  recording_host h;
  relay r({}, h);
  r.start(false);
  CHECK(h.take() == lines{"route[]"});
  r.routed(engine_id{7});
  CHECK(h.take() == lines{"submit 7"});
  CHECK(r.token(engine_id{7}, true, false, false).forward);
  CHECK_FALSE(r.token(engine_id{3}, true, false, false).forward);  // not its engine
  const relay_verdict last = r.token(engine_id{7}, true, true, false);
  CHECK(last.forward);
  CHECK(last.final);
  CHECK(r.done());
  CHECK(r.forwarded() == 2);
  CHECK(h.take() == lines{"release_prefill", "release_decode"});
  CHECK_FALSE(r.token(engine_id{7}, true, true, false).final);  // nothing after the end
}

TEST_CASE("relay: a dead engine is excluded, the next attempt resumes after the tokens the client has") {
  recording_host h;
  relay r({}, h);
  r.start(false);
  r.routed(engine_id{1});
  r.token(engine_id{1}, true, false, false);
  r.token(engine_id{1}, true, false, false);
  h.take();
  r.engine_down(engine_id{2});  // not its engine: nothing
  CHECK(h.take().empty());
  r.engine_down(engine_id{1});
  CHECK(h.take() == lines{"unwatch 1", "release_prefill", "release_decode", "retry_after 200"});
  CHECK_FALSE(r.token(engine_id{1}, true, false, false).forward);  // the dead attempt's late token
  r.retry_due();
  CHECK(h.take() == lines{"route[1]"});
  r.routed(engine_id{4});
  CHECK(h.take() == lines{"submit 4 after 2"});  // the client has tokens 0 and 1: engine 4 continues after them
  CHECK(r.token(engine_id{4}, true, false, false).forward);
  CHECK(r.forwarded() == 3);
}

TEST_CASE("relay: with the planted repeat bug a re-route resubmits without the client's tokens and forwards them again") {
  recording_host h;
  relay r({}, h, relay_bug::repeat_tokens);
  r.start(false);
  r.routed(engine_id{1});
  r.token(engine_id{1}, true, false, false);
  r.engine_down(engine_id{1});
  r.retry_due();
  r.routed(engine_id{2});
  CHECK(h.take().back() == "submit 2");
  CHECK(r.token(engine_id{2}, true, false, false).forward);  // token 0 again: the campaign counts a wrong output
}

TEST_CASE("relay: gives up after max_attempts with the last error, and at once on the request's own fault") {
  recording_host h;
  relay_limits lim;
  lim.max_attempts = 2;
  relay r(lim, h);
  r.start(false);
  r.routed(engine_id{0});
  r.submit_failed(engine_id{9}, {relay_failure::host, 5, false, "stale"}, true);  // another attempt's
  CHECK(h.take() == lines{"route[]", "submit 0"});
  r.submit_failed(engine_id{0}, {relay_failure::host, 5, false, "draining"}, true);
  r.retry_due();
  r.routed(engine_id{1});
  h.take();
  r.token(engine_id{1}, false, true, true);  // the engine failed a step
  CHECK(h.take() == lines{"unwatch 1", "release_prefill", "release_decode",
                          "fail: gave up after 2 attempt(s): the engine failed a step of this request"});
  CHECK(r.done());

  relay bad({}, h);
  bad.start(false);
  bad.routed(engine_id{3});
  h.take();
  bad.submit_failed(engine_id{3}, {relay_failure::host, 1, true, "prompt is empty"}, false);
  CHECK(h.take() == lines{"unwatch 3", "release_prefill", "release_decode", "fail: prompt is empty"});
  CHECK(bad.done());
}

TEST_CASE("relay: waits for an engine while none is up, then fails with the balancer's error") {
  recording_host h;
  relay_limits lim;
  lim.retry_backoff_s = 0.5;
  lim.wait_for_engine_s = 1.0;
  relay r(lim, h);
  r.start(false);
  r.route_failed({relay_failure::host, 8, false, "no engine is up"}, true);
  r.retry_due();
  r.route_failed({relay_failure::host, 8, false, "no engine is up"}, true);
  r.retry_due();
  r.route_failed({relay_failure::host, 8, false, "no engine is up"}, true);
  CHECK(h.take() == lines{"route[]", "retry_after 500", "route[]", "retry_after 500", "route[]", "fail: no engine is up"});
  CHECK(r.done());
  relay now({}, h);
  now.start(false);
  now.route_failed({relay_failure::host, 8, false, "every engine failed this request already"}, false);
  CHECK(now.done());
}

TEST_CASE("relay: a handoff is placed on the first decode engine that takes it") {
  recording_host h;
  relay r({}, h);
  r.start(false);
  r.routed(engine_id{0});
  r.token(engine_id{0}, true, false, false);
  h.take();
  CHECK_FALSE(r.offered(engine_id{5}, 1));  // not its engine: stale
  REQUIRE(r.offered(engine_id{0}, 1));
  CHECK(h.take() == lines{"route_decode 1[]"});
  r.decode_routed(1, engine_id{2});
  r.decode_refused(1, engine_id{2});
  CHECK(h.take() == lines{"offer_to 2 1", "release_decode", "route_decode 1[2]"});
  r.decode_routed(1, engine_id{3});
  r.decode_took(1, engine_id{3});
  CHECK(h.take() == lines{"offer_to 3 1", "unwatch 0", "release_prefill", "placed 0 yes", "watch 3"});
  CHECK(r.engine() == engine_id{3});
  CHECK_FALSE(r.token(engine_id{0}, true, false, false).forward);  // the prefill engine's part is over
  CHECK(r.token(engine_id{3}, true, false, false).forward);         // token 1 comes from the decode engine
  CHECK(r.forwarded() == 2);
  r.decode_took(1, engine_id{6});  // a late answer to the finished placement: cancelled there
  CHECK(h.take() == lines{"cancel 6", "release_decode"});
}

TEST_CASE("relay: when every decode engine refuses or none is found, the prefill engine keeps it") {
  recording_host h;
  relay_limits lim;
  lim.handoff_attempts = 2;
  relay r(lim, h);
  r.start(false);
  r.routed(engine_id{0});
  r.offered(engine_id{0}, 1);
  r.decode_routed(1, engine_id{1});
  r.decode_refused(1, engine_id{1});
  r.decode_routed(1, engine_id{2});
  h.take();
  r.decode_refused(1, engine_id{2});
  CHECK(h.take() == lines{"release_decode", "placed 0 no"});
  CHECK_FALSE(r.placing());
  r.offered(engine_id{0}, 1);
  h.take();
  r.decode_route_failed(3);
  CHECK(h.take() == lines{"placed 0 no"});
  r.decode_route_failed(3);  // a second answer for the same placement changes nothing
  CHECK(h.take().empty());
}

TEST_CASE("relay: the prefill engine going down while placing re-routes and makes the placement stale") {
  recording_host h;
  relay r({}, h);
  r.start(false);
  r.routed(engine_id{0});
  r.offered(engine_id{0}, 1);
  r.decode_routed(1, engine_id{4});
  r.engine_down(engine_id{0});
  h.take();
  r.decode_took(1, engine_id{4});  // took it after the re-route began: cancelled there
  CHECK(h.take() == lines{"cancel 4", "release_decode"});
  r.retry_due();
  CHECK(h.take() == lines{"route[0]"});
}

TEST_CASE("relay: cancel stops the engine's work, a timeout fails the request, both once") {
  recording_host h;
  relay r({}, h);
  r.start(true);
  CHECK(h.take() == lines{"encode"});
  r.images_encoded(nullptr);
  r.routed(engine_id{2});
  h.take();
  r.cancel();
  CHECK(h.take() == lines{"cancel 2", "release_prefill", "release_decode"});
  r.timed_out("late");
  CHECK(h.take().empty());
  relay t({}, h);
  t.start(false);
  t.timed_out("no answer within the request timeout");
  CHECK(h.take() == lines{"route[]", "fail: no answer within the request timeout"});
}

TEST_CASE("handoff leases: not placed ends untaken, placed waits for the release of its own offer") {
  handoff_leases leases;
  const request_id a{1}, b{2};
  const uint64_t la = leases.offer(a);
  const uint64_t lb = leases.offer(b);
  CHECK(la != lb);
  auto pa = leases.placed(a, false);
  CHECK(pa.ended);
  CHECK_FALSE(leases.contains(a));
  CHECK_FALSE(leases.placed(a, true).rearm);  // a late answer
  auto pb = leases.placed(b, true);
  REQUIRE(pb.rearm);
  CHECK(leases.lent_out(b));
  CHECK_FALSE(leases.placed(b, false).ended);  // answered once already
  CHECK_FALSE(leases.expire(b, lb));            // the first deadline is no longer current
  CHECK_FALSE(leases.release(b, lb + 100));     // another lease's release
  CHECK(leases.release(b, lb));
  CHECK(leases.size() == 0);
}

TEST_CASE("handoff leases: a deadline ends the lease, taken only when it had been placed") {
  handoff_leases leases;
  const request_id a{1}, b{2};
  const uint64_t la = leases.offer(a);
  CHECK(leases.expire(a, la) == std::optional<bool>(false));  // the relay never answered
  leases.offer(b);
  const auto pb = leases.placed(b, true);
  CHECK(leases.expire(b, *pb.rearm) == std::optional<bool>(true));  // the decode engine went quiet
  const uint64_t again = leases.offer(b);  // lent again after a re-route: an old release is stale
  CHECK_FALSE(leases.release(b, *pb.rearm));
  CHECK(leases.contains(b));
  leases.drop(b);
  CHECK_FALSE(leases.expire(b, again));
}
