// Engine actor and message types. Deterministic cases drive CAF's test coordinator directly
// (one message per resume, so messages interleave with steps as under load) and compare the
// streamed tokens with a plain runtime::engine; remote cases run two actor systems in this
// process connected over loopback and round-trip every type of the type-ID block.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/after.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/exit_reason.hpp>
#include <caf/io/middleman.hpp>
#include <caf/io/publish.hpp>
#include <caf/io/remote_actor.hpp>
#include <caf/io/unpublish.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include "actors/engine_actor.hpp"
#include "actors/interfaces.hpp"
#include "tests/support/lasting.hpp"
#include "tests/support/tiny_models.hpp"

using namespace shoal;
using actors::engine_stats_snapshot;
using actors::error_reply;
using actors::errc;
using actors::generation_request;
using actors::token_event;
using actors::token_sink_actor;

namespace {

constexpr auto request_timeout = std::chrono::seconds(10);

runtime::engine_config base_config() {
  runtime::engine_config c;
  c.cache.num_blocks = 256;
  c.cache.snapshot_storage = runtime::swa_storage::fp32;
  c.batch_invariant = true;
  return c;
}

runtime::sampling_params greedy(int32_t n) {
  runtime::sampling_params o;
  o.max_tokens = n;
  o.ignore_eos = true;
  return o;
}

generation_request make_request(int64_t id, std::vector<int32_t> prompt, int32_t max_tokens) {
  return {request_id(id), std::move(prompt), greedy(max_tokens)};
}

// What a plain engine generates for `reqs`, queued together in this order.
std::vector<std::vector<int32_t>> reference_outputs(std::shared_ptr<const model::model_weights> w,
                                                    const std::vector<generation_request>& reqs) {
  runtime::engine e(std::move(w), base_config());
  for (const auto& r : reqs) REQUIRE(e.add_request(r.prompt, r.sampling));
  std::vector<std::vector<int32_t>> out;
  for (auto& c : e.run_to_completion()) out.push_back(c.output);
  return out;
}

std::vector<int32_t> tokens_of(const std::vector<token_event>& events) {
  std::vector<int32_t> t;
  for (const auto& ev : events) t.push_back(ev.token);
  return t;
}

// -- deterministic cases ----------------------------------------------------------------

struct test_config : caf::actor_system_config {
  test_config() {
    set("scheduler.policy", caf::atom("testing"));
    set("scheduler.max-throughput", size_t{1});  // one message per resume: steps interleave
    actors::add_message_types(*this);
  }
};

// What a client actor saw, by the caller's request id.
struct outcome {
  std::map<int64_t, std::vector<token_event>> events;
  std::map<int64_t, request_id> accepted;
  std::map<int64_t, error_reply> refused;
  std::vector<bool> cancel_replies;
  std::vector<engine_stats_snapshot> stats;
};

enum class client_mode {
  plain,          // submit and collect
  cancel_first,   // also cancel the first request as soon as it is accepted
  quit_on_event,  // exit at the first token event
};

// Submits `reqs` in order and collects the replies and token events into `out`.
caf::behavior client(caf::event_based_actor* self, actors::engine_actor engine,
                     std::vector<generation_request> reqs, outcome* out, client_mode mode) {
  for (size_t i = 0; i < reqs.size(); ++i) {
    int64_t id = reqs[i].id.value;
    bool cancel = mode == client_mode::cancel_first && i == 0;
    self->request(engine, request_timeout, submit_atom_v, reqs[i])
      .then(
        [=](request_id got) {
          out->accepted[id] = got;
          if (!cancel) return;
          self->request(engine, request_timeout, cancel_atom_v, got).then([=](bool ok) {
            out->cancel_replies.push_back(ok);
          });
        },
        [=](caf::error& e) { out->refused[id] = actors::to_error_reply(e); });
  }
  return {
    [=](const token_event& ev) {
      out->events[ev.id.value].push_back(ev);
      if (mode == client_mode::quit_on_event) self->quit();
    },
  };
}

// Asks `engine` for its stats once.
caf::behavior stats_reader(caf::event_based_actor* self, actors::engine_actor engine, outcome* out) {
  self->request(engine, request_timeout, stats_atom_v).then([=](const engine_stats_snapshot& s) {
    out->stats.push_back(s);
    self->quit();
  });
  return {};
}

struct deterministic_fixture {
  test_config cfg;
  caf::actor_system sys{cfg};
  caf::scheduler::test_coordinator& sched = dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler());
  std::shared_ptr<const model::model_weights> weights = test::tiny_model("tiny");
  actors::engine_actor engine = actors::spawn_engine(sys, weights, base_config());
  std::vector<caf::actor> clients;  // stopped with the engine: the system waits for every actor

  // Runs until no actor has a message, one message per turn, round robin. The coordinator's
  // own run() puts an actor with more mail back at the front, so a stepping engine would
  // never yield; round robin is what a fair multi-threaded scheduler looks like.
  void run() {
    while (sched.try_run_once())
      if (sched.jobs.size() > 1) std::rotate(sched.jobs.begin(), sched.jobs.begin() + 1, sched.jobs.end());
  }

  // Spawns a client submitting `reqs` (see client) and runs until every actor is idle.
  void submit(std::vector<generation_request> reqs, outcome& o, client_mode mode = client_mode::plain) {
    clients.push_back(sys.spawn(client, engine, std::move(reqs), &o, mode));
    run();
  }

  engine_stats_snapshot read_stats() {
    outcome o;
    sys.spawn(stats_reader, engine, &o);
    run();
    REQUIRE(o.stats.size() == 1);
    return o.stats[0];
  }

  ~deterministic_fixture() {
    caf::anon_send_exit(engine, caf::exit_reason::user_shutdown);
    for (auto& c : clients) caf::anon_send_exit(c, caf::exit_reason::user_shutdown);
    run();
  }
};

}  // namespace

TEST_CASE("engine actor streams the same greedy tokens as a plain engine, bad requests get errors") {
  deterministic_fixture f;
  std::vector<generation_request> good = {make_request(10, test::random_tokens(20, 1), 8),
                                          make_request(11, test::random_tokens(35, 2), 6),
                                          make_request(12, test::random_tokens(50, 3), 9)};
  auto expected = reference_outputs(f.weights, good);
  auto reqs = good;
  reqs.push_back(make_request(13, {}, 4));                          // empty prompt
  reqs.push_back(make_request(10, test::random_tokens(5, 4), 4));   // id 10 still running
  reqs.push_back(make_request(14, {1, 2, 300}, 4));                 // token outside the vocabulary
  outcome o;
  f.submit(reqs, o);

  for (size_t i = 0; i < good.size(); ++i) {
    int64_t id = good[i].id.value;
    CAPTURE(id);
    CHECK(o.accepted.at(id) == good[i].id);
    const auto& events = o.events[id];
    CHECK(tokens_of(events) == expected[i]);
    REQUIRE(!events.empty());
    for (size_t k = 0; k + 1 < events.size(); ++k) CHECK(!events[k].finished);
    CHECK(events.back().finished);
    CHECK(events.back().reason == runtime::finish_reason::length);
  }
  CHECK(o.refused.at(13) == error_reply{errc::invalid_request, "prompt is empty"});
  CHECK(o.refused.at(10).code == errc::duplicate_request);
  CHECK(o.refused.at(14).code == errc::invalid_request);
  CHECK(o.refused.at(14).message.find("outside the vocabulary") != std::string::npos);
  CHECK(!o.events.contains(13));
  CHECK(!o.events.contains(14));

  auto s = f.read_stats();
  CHECK(s.engine.generated == 8 + 6 + 9);
  CHECK(s.requests_running == 0);
  CHECK(s.engine.steps >= 9);
  CHECK(s.engine.blocks_total == 256);
}

TEST_CASE("cancel ends a running request with one aborted event, the others are unaffected") {
  deterministic_fixture f;
  std::vector<generation_request> reqs = {make_request(1, test::random_tokens(30, 5), 40),
                                          make_request(2, test::random_tokens(25, 6), 5)};
  auto expected = reference_outputs(f.weights, reqs);
  outcome o;
  f.submit(reqs, o, client_mode::cancel_first);

  // Round robin: the cancel queues behind the first step and lands while the second step
  // (dispatched ahead by async scheduling) is in flight; that step's token for 1 is dropped.
  REQUIRE(o.cancel_replies == std::vector<bool>{true});
  const auto& cancelled = o.events[1];
  REQUIRE(cancelled.size() == 2);
  CHECK(cancelled[0] == token_event{request_id(1), expected[0][0], false, runtime::finish_reason::none});
  CHECK(cancelled[1] == token_event{request_id(1), -1, true, runtime::finish_reason::aborted});
  CHECK(tokens_of(o.events[2]) == expected[1]);
  auto s = f.read_stats();
  CHECK(s.engine.generated == 2 + 5);
  CHECK(s.requests_running == 0);

  outcome again;  // the id is free again
  f.submit({make_request(1, test::random_tokens(8, 7), 2)}, again);
  CHECK(tokens_of(again.events[1]).size() == 2);
  CHECK(f.read_stats().requests_running == 0);
}

TEST_CASE("a sink that goes down stops its requests") {
  deterministic_fixture f;
  outcome o;
  f.submit({make_request(7, test::random_tokens(30, 8), 60)}, o, client_mode::quit_on_event);
  CHECK(o.events[7].size() == 1);  // it quit after the first token
  auto s = f.read_stats();
  CHECK(s.requests_running == 0);
  CHECK(s.engine.generated == 3);  // two more steps ran before the down message had its turn
}

// -- remote cases -------------------------------------------------------------------------

namespace {

struct remote_config : caf::actor_system_config {
  remote_config() {
    load<caf::io::middleman>();
    actors::add_message_types(*this);
    set("middleman.heartbeat-interval", caf::timespan{std::chrono::milliseconds(200)});
    set("middleman.connection-timeout", caf::timespan{std::chrono::seconds(5)});
  }
};

// Sends every message it gets back to its sender unchanged.
caf::behavior echo(caf::event_based_actor* self) {
  self->set_default_handler(caf::reflect);
  return {[](caf::ok_atom) {}};
}

// Two actor systems talking over the middleman on 127.0.0.1; they last until the process ends
// (tests/support/lasting.hpp says why).
struct remote_systems {
  remote_config server_cfg, client_cfg;
  caf::actor_system server{server_cfg};
  caf::actor_system client{client_cfg};
};

struct remote_fixture {
  caf::actor_system& server = test::lasting<remote_systems>().server;
  caf::actor_system& client = test::lasting<remote_systems>().client;
  std::vector<std::pair<caf::actor, uint16_t>> published;  // server-side actors, stopped at the end

  // Publishes `handle` on 127.0.0.1 (port chosen by the OS) and connects to it from `client`.
  template <class Handle>
  Handle connect(const Handle& handle) {
    auto port = caf::io::publish(handle, 0, "127.0.0.1");
    REQUIRE(port);
    published.emplace_back(caf::actor_cast<caf::actor>(handle), *port);
    auto remote = caf::io::remote_actor<Handle>(client, "127.0.0.1", *port);
    REQUIRE(remote);
    REQUIRE(remote->node() != client.node());  // a real proxy, not a local shortcut
    return *remote;
  }

  // Each server-side actor is unpublished, stopped and awaited, so the next case starts clean.
  ~remote_fixture() {
    caf::scoped_actor self{server};
    for (auto& [a, port] : published) {
      caf::io::unpublish(a, port);
      self->send_exit(a, caf::exit_reason::user_shutdown);
      self->wait_for(a);
    }
  }
};

// Round-trips one message through the remote echo and checks it comes back equal.
template <class... Ts>
void round_trip(caf::scoped_actor& self, const caf::actor& remote, const Ts&... xs) {
  bool replied = false;
  self->request(remote, request_timeout, xs...)
    .receive(
      [&](const Ts&... back) {
        replied = true;
        CHECK(std::tie(back...) == std::tie(xs...));
      },
      [&](caf::error& e) { FAIL("round trip failed: " << self->system().render(e)); });
  CHECK(replied);
}

}  // namespace

namespace {

// An image of side `side` at `pos` over `count` placeholders, with pixels `rgb`.
runtime::prompt_image test_image(int64_t pos, int64_t count, std::array<uint64_t, 2> hash, int64_t side,
                                 std::vector<uint8_t> rgb) {
  auto px = std::make_shared<runtime::rgb_image>();
  px->width = side, px->height = side, px->rgb = std::move(rgb);
  return {pos, count, hash, std::move(px), {}};
}

// A handoff offer with every field set (two blocks, one ring, an empty ring).
actors::handoff_offer offer_example(caf::actor prefill) {
  actors::handoff_offer o;
  o.id = request_id(77);
  o.prefill = std::move(prefill);
  o.blocks_needed = 3;
  o.lease = 4;
  o.tokens = {256, 5, 6, 7, 99};
  o.prompt_len = 4;
  o.images = {test_image(1, 2, {3, 4}, 14, std::vector<uint8_t>(14 * 14 * 3, 9))};
  o.sampling.temperature = 0.5f;
  o.sampling.seed = 99;
  o.sampling.stop_strings = {"END"};
  o.seq_seed = 1ull << 60;
  o.cls = runtime::traffic_class::agent;
  o.text = "h\xc3\xa9";
  o.computed = 4;
  o.dec_from = 2;
  o.ring_tokens = 32;
  o.ring_floor = {0, -1};
  o.cached_tokens = 16;
  o.swa_approx = true;
  o.snapshot_at = 16;
  o.blocks = {{{1, 2, 3}, 4096, 0xabcdef, 65536, 0xdeadbeef}, {{1, 2, 3}, 8192, 0xabcdef, 65536, 7}};
  o.rings = {{{9}, 1, 2, 3, 4}, {}};
  return o;
}

// True when Ts are exactly the types of the shoal type-ID block: a type added to the block
// without a round trip below fails to compile here.
template <class... Ts>
constexpr bool is_the_type_id_block() {
  constexpr caf::type_id_t ids[] = {caf::type_id<Ts>::value...};
  for (caf::type_id_t id = caf::id_block::shoal::begin; id < caf::id_block::shoal::end; ++id) {
    bool found = false;
    for (caf::type_id_t x : ids) found = found || x == id;
    if (!found) return false;
  }
  return sizeof...(Ts) == caf::id_block::shoal::end - caf::id_block::shoal::begin;
}

static_assert(is_the_type_id_block<request_id, error_reply, runtime::sampling_params, generation_request, token_event,
                                   engine_stats_snapshot, token_sink_actor, actors::engine_actor, actors::rank_info,
                                   actors::node_info, actors::membership, actors::ep_frame, actors::text_event,
                                   actors::rank_actor, actors::node_agent_actor, actors::prefill_balancer_actor,
                                   actors::decode_balancer_actor, actors::balancer_engine_row, actors::balancer_report,
                                   actors::gateway_actor, std::vector<std::string>, std::vector<int32_t>, actors::chunk_put,
                                   actors::chunk_query, actors::storage_stats_snapshot, actors::storage_node_actor,
                                   std::vector<uint8_t>, runtime::block_key, std::vector<runtime::block_key>,
                                   actors::handoff_offer, runtime::remote_memory, actors::swa_report, actors::swa_hit,
                                   actors::swa_directory_stats, actors::swa_store_stats, actors::swa_store_actor,
                                   actors::swa_directory_actor, runtime::prompt_image,
                                   std::vector<runtime::prompt_image>, std::vector<runtime::remote_memory>,
                                   actors::ve_worker_stats, actors::ve_worker_row, actors::ve_report,
                                   actors::ve_worker_actor, actors::ve_balancer_actor, actors::placement_msg,
                                   actors::expert_load_msg, actors::expert_lend_msg, runtime::expert_part,
                                   std::vector<runtime::expert_part>>(),
              "the round trip below covers exactly these types");

}  // namespace

TEST_CASE("every type of the type-ID block round-trips through a remote actor") {
  remote_fixture f;
  caf::actor remote = f.connect(f.server.spawn(echo));
  caf::scoped_actor self{f.client};
  auto sink = caf::actor_cast<token_sink_actor>(self);
  // Distinct local actors stand in for engines, ranks and agents: handles must come back as
  // the same actors (and `remote`, a proxy, as the same proxy).
  std::vector<caf::actor> locals;
  for (int i = 0; i < 3; ++i) locals.push_back(f.client.spawn(echo));
  auto stop_locals = [&] {
    for (auto& a : locals) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  };

  runtime::sampling_params full;
  full.temperature = 0.7f;
  full.top_k = 40;
  full.top_p = 0.9f;
  full.max_tokens = 123;
  full.stop_token_ids = {7, 8};
  full.stop_strings = {"\n\n", "END"};
  full.ignore_eos = true;
  full.seed = 0xfedcba9876543210ull;
  full.logit_bias = {{3, -100.0f}, {250, 7.5f}};
  full.constraint = {runtime::constraint_kind::regex, "[a-z]+"};
  full.logprobs = 3;
  full.presence_penalty = -0.5f;
  full.frequency_penalty = 1.25f;
  generation_request req{request_id(1ll << 40), {256, 1, 2, 299}, full};

  actors::rank_info rank0{0, locals[0], locals[1]};
  actors::rank_info rank1{1, remote, {}};  // a remote engine, no rank actor (no expert parallelism)
  actors::node_info engine_node{"node-b", "127.0.0.1", 4711, {"engine", "storage"},
                                caf::actor_cast<caf::actor>(self), {rank0, rank1}, {locals[2], remote}, true, {4100, 0},
                                "prefill", locals[1], {}, {}, locals[0], {}, {}, 0, 0};
  actors::node_info gateway_node{"node-a", "::1", 0, {"gateway", "directory"}, locals[2], {}, {}, false, {}, "both",
                                 {}, locals[0], {locals[1], locals[2], remote}, {}, {}, {}, 0, 0};
  std::vector<uint8_t> mib(1 << 20);
  for (size_t i = 0; i < mib.size(); ++i) mib[i] = static_cast<uint8_t>(i * 131 + (i >> 12));

  // One row per type of the block, in block order.
  round_trip(self, remote, request_id(42));
  round_trip(self, remote, error_reply{errc::duplicate_request, "request 3 is still running"});
  round_trip(self, remote, full);
  round_trip(self, remote, runtime::sampling_params{});
  round_trip(self, remote, req);
  round_trip(self, remote, token_event{request_id(3), 77, true, runtime::finish_reason::stop});
  round_trip(self, remote, token_event{request_id(4), 12, true, runtime::finish_reason::length, 48});
  // Every counter of the engine's stats distinct, so a field lost or swapped on the wire shows.
  runtime::engine_stats es;
  es.steps = 1, es.prefill_tokens = 2, es.decode_tokens = 3, es.generated = 4, es.failed_steps = 5;
  es.forward_s = 0.5, es.idle_s = 0.75, es.plan_s = 0.125;
  es.running = 6, es.waiting = 7, es.waiting_for_remote = 8;
  es.cache = {9, 10, 11, 12, 13, 14, 15, 58, "read failed", 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 56, 57, 28, 29, 2.5};
  es.swa = {30, 31, 32, 33, 59};
  es.blocks_free = 34, es.blocks_total = 35, es.kv_tokens = 36;
  es.handoffs_offered = 37, es.handoffs_lent = 38, es.handoffs_kept = 39, es.handoffs_refused_format = 60;
  es.images_encoded = 40, es.image_patches_encoded = 41, es.image_rows_read = 42, es.image_row_read_failures = 43;
  es.image_cache = {44, 45, 46, 47, 48, 49};
  es.spec = {50, 51, 52, 53, 54};
  round_trip(self, remote, engine_stats_snapshot{es, "decode", 55, 0.25, 12.5,
                                                 {request_id(3), request_id(1ll << 40)},
                                                 {{request_id(5), runtime::finish_reason::handed_off},
                                                  {request_id(6), runtime::finish_reason::length}}});
  round_trip(self, remote, sink);  // a local handle comes back as itself
  round_trip(self, remote, caf::actor_cast<actors::engine_actor>(locals[0]));
  round_trip(self, remote, rank0);
  round_trip(self, remote, rank1);
  round_trip(self, remote, engine_node);
  round_trip(self, remote, actors::membership{7, {gateway_node, engine_node}});
  round_trip(self, remote, actors::membership{});
  round_trip(self, remote, actors::ep_frame{0xabcdef0123456789ull, 1ull << 33, 5, 1, 3, mib, {}});
  round_trip(self, remote, actors::ep_frame{1, 0, 0, 0, 0, {}, {}});
  round_trip(self, remote, actors::ep_frame{2, 9, 3, 0, 1, {}, runtime::remote_memory{{1, 2}, 1ull << 40, 77, 4096, 0xabcd}});
  round_trip(self, remote, actors::text_event{request_id(8), "h\xc3\xa9llo \xe2\x9c\x93", false, runtime::finish_reason::none, ""});
  round_trip(self, remote, actors::text_event{request_id(8), "", true, runtime::finish_reason::error, "rank 1 lost"});
  round_trip(self, remote, caf::actor_cast<actors::rank_actor>(locals[1]));
  round_trip(self, remote, caf::actor_cast<actors::node_agent_actor>(self));
  round_trip(self, remote, caf::actor_cast<actors::prefill_balancer_actor>(locals[2]));
  round_trip(self, remote, caf::actor_cast<actors::decode_balancer_actor>(locals[2]));
  round_trip(self, remote, caf::actor_cast<actors::gateway_actor>(locals[0]));
  round_trip(self, remote, caf::actor_cast<actors::rank_actor>(remote));  // a proxy stays that proxy
  round_trip(self, remote, std::vector<std::string>{"id=1 tokens=3", "", "id=2 tokens=0"});
  round_trip(self, remote, std::vector<std::string>{});
  round_trip(self, remote, actors::chunk_put{{0xfedcba9876543210ull, 0x0123456789abcdefull}, 11, runtime::traffic_class::chat, mib});
  round_trip(self, remote, actors::chunk_put{});
  round_trip(self, remote, actors::chunk_query{{{1, 2}, {3, 4}}, {0, 11}});
  round_trip(self, remote, actors::storage_stats_snapshot{1, 2, 3, 90, 70, 4, 5, 6, 7, 8, 9, 10, 11, 12, 0.25, 0.5});
  round_trip(self, remote, caf::actor_cast<actors::storage_node_actor>(locals[1]));
  round_trip(self, remote, mib);
  round_trip(self, remote, std::vector<uint8_t>{});
  round_trip(self, remote, offer_example(locals[0]));
  round_trip(self, remote, actors::handoff_offer{});
  round_trip(self, remote, runtime::remote_memory{{1, 2, 3}, 1ull << 40, 0xabcdef, 1415040, 0xdeadbeef});
  round_trip(self, remote, actors::swa_report{"node-b", locals[1], true, {{1, 2}, {3, 4}}, {{5, 6}}});
  round_trip(self, remote, actors::swa_report{});
  round_trip(self, remote, actors::swa_hit{3, remote, "node-c"});
  round_trip(self, remote, actors::swa_hit{});
  round_trip(self, remote, actors::swa_directory_stats{12, {"a", "b"}, {5, 7}, 9, 4, 30, 2});
  round_trip(self, remote, actors::swa_store_stats{5, 256, 1415040, 9, 4, 3});
  round_trip(self, remote, caf::actor_cast<actors::swa_store_actor>(locals[2]));
  round_trip(self, remote, caf::actor_cast<actors::swa_directory_actor>(remote));
  runtime::prompt_image image = test_image(5, 4, {0x0123456789abcdefull, 0xfedcba9876543210ull}, 28,
                                            {mib.begin(), mib.begin() + 28 * 28 * 3});
  image.rows = runtime::remote_memory{{9, 8, 7}, 1ull << 41, 0x1234, 4 * 256 * 4, 0xfeedf00d};
  round_trip(self, remote, image);
  round_trip(self, remote, runtime::prompt_image{});
  auto with_images = req;
  with_images.images = {image, image};
  round_trip(self, remote, with_images);
  round_trip(self, remote, std::vector<runtime::prompt_image>{image, runtime::prompt_image{}});
  round_trip(self, remote, std::vector<runtime::remote_memory>{image.rows, {}});
  round_trip(self, remote, actors::ve_worker_stats{"ve-a", 1, 2, 3, 4, 5, 6, 7, 0.5});
  round_trip(self, remote, actors::ve_worker_row{"ve-b", true, 1, 256, 3, 4, 5});
  round_trip(self, remote, actors::ve_report{{{"ve-a", false, 0, 0, 9, 9, 0}, {"ve-b", true, 1, 256, 3, 4, 5}}, 12, 2, 1});
  round_trip(self, remote, caf::actor_cast<actors::ve_worker_actor>(locals[1]));
  round_trip(self, remote, caf::actor_cast<actors::ve_balancer_actor>(remote));
  const actors::placement_msg placed{3, 2, 4, 2, {0, 2, 4, 6, 8}, {0, 1, 2, 3, 0, 3, 1, 2}};
  round_trip(self, remote, placed);
  round_trip(self, remote, actors::placement_msg{});
  round_trip(self, remote, actors::expert_load_msg{0xfeedull, 1ull << 35, 100, {1.5, 0, 7}, {0.25}, placed, 4, 99,
                                                  1 << 20, 5 << 20, 7, 3 << 20, 2, 9 << 20, "reading expert 3: timed out"});
  round_trip(self, remote, actors::expert_load_msg{});
  round_trip(self, remote, actors::expert_lend_msg{0xfeedull, 3, 61'000, {0, 1, 1}, {5, 2, 7}});
  round_trip(self, remote, actors::expert_lend_msg{});
  const runtime::expert_part part{1, 7, 1, 2, 128, image.rows};
  round_trip(self, remote, part);
  round_trip(self, remote, std::vector<runtime::expert_part>{part, runtime::expert_part{}});

  // A caf::error carrying an error_reply (how actors answer a refused request; the remote
  // engine case checks that path end to end). A message holding only an error would go to
  // the echo's error handler, so an atom rides along.
  error_reply sent{errc::invalid_request, "prompt is empty"};
  bool replied = false;
  self->request(remote, request_timeout, caf::ok_atom_v, actors::make_error(sent))
    .receive(
      [&](caf::ok_atom, const caf::error& back) {
        replied = true;
        CHECK(actors::to_error_reply(back) == sent);
        CHECK(f.client.render(back) == "shoal::invalid_request: prompt is empty");
      },
      [&](caf::error& e) { FAIL("round trip failed: " << f.client.render(e)); });
  CHECK(replied);
  stop_locals();
}

TEST_CASE("every message of the typed interfaces that crosses processes round-trips through a remote actor") {
  remote_fixture f;
  caf::actor remote = f.connect(f.server.spawn(echo));
  caf::scoped_actor self{f.client};
  caf::actor me = caf::actor_cast<caf::actor>(self);
  caf::actor other = f.client.spawn(echo);
  auto sink = caf::actor_cast<token_sink_actor>(self);
  generation_request req{request_id(5), {256, 9, 8}, greedy(3)};
  actors::node_info node{"node-c", "10.0.0.3", 7000, {"engine"}, me, {{0, other, me}}, {}, false, {}, "both", {}, {}, {}, {}, {}, {}, 0, 0};
  actors::ep_frame frame{11, 3, 2, 0, 1, std::vector<uint8_t>(4096, 0x5a), {}};

  // engine_actor (replies: request_id, bool, engine_stats_snapshot)
  round_trip(self, remote, submit_atom_v, req);
  round_trip(self, remote, submit_atom_v, req, sink);
  round_trip(self, remote, cancel_atom_v, request_id(9));
  round_trip(self, remote, stats_atom_v);
  round_trip(self, remote, drain_atom_v);
  round_trip(self, remote, lockstep_atom_v, uint64_t{0xfeedull << 40}, uint64_t{17});
  round_trip(self, remote, lockstep_atom_v, uint64_t{42}, int32_t{1}, std::vector<caf::actor>{me, remote, other});
  round_trip(self, remote, lockstep_atom_v, uint64_t{43}, int32_t{0}, std::vector<caf::actor>{});
  round_trip(self, remote, handoff_atom_v, offer_example(other), sink);
  round_trip(self, remote, handoff_atom_v, request_id(5), true);
  round_trip(self, remote, release_atom_v, request_id(6), uint64_t{2});
  round_trip(self, remote, true);
  // token_sink_actor and the shell's text sink
  round_trip(self, remote, token_event{request_id(5), -1, true, runtime::finish_reason::aborted});
  round_trip(self, remote, actors::text_event{request_id(5), "abc", true, runtime::finish_reason::stop, ""});
  round_trip(self, remote, handoff_atom_v, offer_example(remote));
  // rank_actor
  round_trip(self, remote, expert_atom_v, frame);
  round_trip(self, remote, expert_atom_v, actors::ep_frame{11, 3, 2, 1, 0, {}, {}});
  // node_agent_actor (replies: membership, bool, string, vector<string>, request_id)
  round_trip(self, remote, join_atom_v, node);
  round_trip(self, remote, update_atom_v, node);
  round_trip(self, remote, members_atom_v);
  round_trip(self, remote, describe_atom_v, std::string{"rank0"});
  round_trip(self, remote, requests_atom_v);
  round_trip(self, remote, kill_atom_v, std::string{"node-c"});
  round_trip(self, remote, submit_atom_v, std::string{"Hello"}, int32_t{12}, me);
  round_trip(self, remote, subscribe_atom_v, other);
  round_trip(self, remote, actors::membership{3, {node}});
  round_trip(self, remote, std::string{"node-c listen=10.0.0.3:7000 roles=engine"});
  // prefill_balancer_actor, decode_balancer_actor (replies: caf::actor, balancer_report)
  round_trip(self, remote, route_atom_v, request_id(3), std::vector<int32_t>{1, 2, 3}, std::vector<caf::actor>{other, remote});
  round_trip(self, remote, route_atom_v, request_id(3), std::vector<int32_t>{}, std::vector<caf::actor>{});
  round_trip(self, remote, route_atom_v, decode_atom_v, request_id(3), int64_t{6}, int64_t{90}, int64_t{16},
             std::vector<caf::actor>{other});
  round_trip(self, remote, done_atom_v, request_id(3));
  round_trip(self, remote, actors::balancer_report{"prefill", "tiered", {{"n/0", 1, 2, 300, 0.5, 7}}, {16384}, {4, 1}, 0.9, 0.8, "the engines' own: 1 of 1"});
  // ve_worker_actor, ve_balancer_actor (replies: vector<remote_memory>, ve_worker_stats, ve_report)
  runtime::prompt_image im = test_image(0, 4, {1, 2}, 28, std::vector<uint8_t>(28 * 28 * 3, 7));
  round_trip(self, remote, encode_atom_v, std::vector<runtime::prompt_image>{im});
  round_trip(self, remote, encode_atom_v, request_id(4), std::vector<runtime::prompt_image>{im, im});
  round_trip(self, remote, remote);
  // gateway_actor (replies: vector<string>, bool, string, int64_t, request_id)
  round_trip(self, remote, describe_atom_v);
  round_trip(self, remote, int64_t{-3});
  // storage_node_actor (replies: bool, vector<uint8_t>, storage_stats_snapshot, uint64_t)
  round_trip(self, remote, put_atom_v, actors::chunk_put{{8, 7}, 3, runtime::traffic_class::agent, std::vector<uint8_t>(1000, 7)});
  round_trip(self, remote, get_atom_v, runtime::block_key{8, 7}, int32_t{3});
  round_trip(self, remote, exists_atom_v, actors::chunk_query{{{8, 7}, {10, 9}}, {3, 4}});
  round_trip(self, remote, corrupt_atom_v, runtime::block_key{8, 7}, int32_t{3});
  round_trip(self, remote, runtime::block_key{0x1234, 0xfedc});
  round_trip(self, remote, std::vector<runtime::block_key>{{1, 2}, {3, 4}});
  round_trip(self, remote, gc_atom_v);
  round_trip(self, remote, uint64_t{12});
  caf::anon_send_exit(other, caf::exit_reason::user_shutdown);
}

TEST_CASE("remote engine: streamed tokens equal the plain engine's, errors arrive as error replies") {
  remote_fixture f;
  std::shared_ptr<const model::model_weights> weights = test::tiny_model("tiny");
  auto engine = f.connect(actors::spawn_engine(f.server, weights, base_config(), true));
  caf::scoped_actor self{f.client};
  auto req = make_request(5, test::random_tokens(24, 9), 7);
  auto expected = reference_outputs(weights, {req});

  std::vector<int32_t> tokens;
  self->request(engine, request_timeout, submit_atom_v, req)
    .receive([&](request_id id) { CHECK(id == req.id); },
             [&](caf::error& e) { FAIL(f.client.render(e)); });
  bool finished = false;
  self->receive_while([&] { return !finished; })(
    [&](const token_event& ev) {
      CHECK(ev.id == req.id);
      tokens.push_back(ev.token);
      finished = ev.finished;
    },
    caf::after(request_timeout) >> [&] { FAIL("no token within the timeout"); });
  CHECK(tokens == expected[0]);

  bool refused = false;
  self->request(engine, request_timeout, submit_atom_v, make_request(6, {}, 3))
    .receive([&](request_id) { FAIL("an empty prompt was accepted"); },
             [&](caf::error& e) {
               refused = true;
               CHECK(actors::to_error_reply(e) == error_reply{errc::invalid_request, "prompt is empty"});
             });
  CHECK(refused);

  self->request(engine, request_timeout, stats_atom_v)
    .receive([&](const engine_stats_snapshot& s) { CHECK(s.engine.generated == 7); },
             [&](caf::error& e) { FAIL(f.client.render(e)); });
}
