// The bulk data path over real sockets: a bulk_server on a chunk store in a temp directory,
// clients through bulk_exchange, and hand-made bad frames from a raw socket.
#include "storage/bulk.hpp"

#include <doctest/doctest.h>

#include <msgpack.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

#include "tests/storage/store_fixture.hpp"
#include "tests/support/hung_listener.hpp"

using namespace shoal::storage;
using namespace shoal::storage::test;
using namespace std::chrono_literals;

namespace {

struct served_store {
  temp_dir dir;
  fake_clock clock;
  std::shared_ptr<chunk_store> store;
  std::unique_ptr<bulk_server> server;
  bulk_endpoint endpoint;

  served_store() {
    store_options o;
    o.root = dir.path;
    o.capacity_bytes = 64 << 20;
    o.max_chunk_bytes = 1 << 20;
    o.sync = sync_policy::never;
    o.now_ms = clock.fn();
    auto s = chunk_store::open(o);
    REQUIRE(s);
    store = std::move(*s);
    auto b = bulk_server::start(store, {});
    REQUIRE_MESSAGE(b, b.error());
    server = std::move(*b);
    endpoint = {"node-0", "127.0.0.1", server->port()};
  }
};

std::vector<uint8_t> bytes_of(const chunk_key& k, size_t n) {
  auto p = payload_of(k, 1, n);
  std::vector<uint8_t> out(n);
  std::memcpy(out.data(), p.data(), n);
  return out;
}

int raw_connect(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  return fd;
}

void send_raw(int fd, uint32_t declared, const std::vector<uint8_t>& body) {
  uint8_t len[4] = {uint8_t(declared >> 24), uint8_t(declared >> 16), uint8_t(declared >> 8), uint8_t(declared)};
  REQUIRE(::send(fd, len, 4, MSG_NOSIGNAL) == 4);
  if (!body.empty()) REQUIRE(::send(fd, body.data(), body.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(body.size()));
}

// Reads one reply frame (or nothing when the server closed first); then whether it closed.
struct raw_result {
  std::optional<bulk_reply> reply;
  bool closed = false;
};
raw_result read_raw(int fd) {
  raw_result r;
  std::vector<uint8_t> in;
  uint8_t buf[4096];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 5000) != 1) break;
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) {
      r.closed = true;
      break;
    }
    in.insert(in.end(), buf, buf + n);
  }
  if (in.size() >= 4) {
    uint32_t n = (uint32_t{in[0]} << 24) | (uint32_t{in[1]} << 16) | (uint32_t{in[2]} << 8) | in[3];
    REQUIRE(in.size() == 4 + size_t{n});
    auto rep = parse_reply({in.data() + 4, n});
    REQUIRE_MESSAGE(rep, rep.error());
    r.reply = std::move(*rep);
  }
  return r;
}

struct sink {
  std::vector<uint8_t> bytes;
  void write(const char* p, size_t n) { bytes.insert(bytes.end(), p, p + n); }
};

// A request array with one field replaced (or the field count changed).
std::vector<uint8_t> request_with(int replace, const std::function<void(msgpack::packer<sink>&)>& value, int fields = 9) {
  sink s;
  msgpack::packer<sink> pk(s);
  pk.pack_array(fields);
  auto field = [&](int i, auto good) {
    if (i >= fields) return;
    if (i == replace) value(pk);
    else good();
  };
  field(0, [&] { pk.pack(std::string_view("shoal-kv")); });
  field(1, [&] { pk.pack(uint64_t{1}); });
  field(2, [&] { pk.pack(std::string_view("get")); });
  field(3, [&] { pk.pack(uint64_t{7}); });
  field(4, [&] { pk.pack(uint64_t{1}); });
  field(5, [&] { pk.pack(uint64_t{2}); });
  field(6, [&] { pk.pack(uint64_t{3}); });
  field(7, [&] { pk.pack(uint64_t{0}); });
  field(8, [&] { pk.pack_bin(0); });
  return s.bytes;
}

}  // namespace

TEST_CASE("bulk: puts and gets in flight on one connection, errors per request, abandoned replies skipped") {
  served_store s;
  bulk_pool pool;
  std::vector<chunk_key> keys;
  std::vector<std::vector<uint8_t>> chunks;
  for (uint64_t i = 0; i < 20; ++i) {
    keys.push_back(key_of(i, static_cast<uint8_t>(i % 12)));
    chunks.push_back(bytes_of(keys.back(), 1000 + 37 * i));
  }
  {
    bulk_exchange ex(pool, 1s);
    for (size_t i = 0; i < keys.size(); ++i) ex.add(s.endpoint, {bulk_op::put, 0, keys[i], 1, chunks[i]});
    ex.run_until(std::chrono::steady_clock::now() + 5s, nullptr);
    for (size_t i = 0; i < keys.size(); ++i) CHECK_MESSAGE(ex[i].ok, ex[i].error);
  }
  CHECK(s.store->stats().chunks == keys.size());
  {
    bulk_exchange ex(pool, 1s);
    for (const auto& k : keys) ex.add(s.endpoint, {bulk_op::get, 0, k, 0, {}});
    size_t missing = ex.add(s.endpoint, {bulk_op::get, 0, key_of(999), 0, {}});
    ex.run_until(std::chrono::steady_clock::now() + 5s, nullptr);
    for (size_t i = 0; i < keys.size(); ++i) {
      REQUIRE_MESSAGE(ex[i].ok, ex[i].error);
      CHECK(ex[i].payload == chunks[i]);
    }
    CHECK(ex[missing].done);
    CHECK_FALSE(ex[missing].ok);
    CHECK(ex[missing].error.find("node-0") != std::string::npos);
    CHECK(ex[missing].error.find("not_found") != std::string::npos);
  }
  // An exchange that stops after the first reply leaves 19 replies owed on its connection;
  // the next exchange on the pooled connection skips them and gets its own.
  {
    bulk_exchange ex(pool, 1s);
    for (const auto& k : keys) ex.add(s.endpoint, {bulk_op::get, 0, k, 0, {}});
    ex.run_until(std::chrono::steady_clock::now() + 5s, [&] { return ex[0].done; });
    CHECK(ex[0].ok);
  }
  {
    bulk_exchange ex(pool, 1s);
    size_t c = ex.add(s.endpoint, {bulk_op::get, 0, keys[7], 0, {}});
    ex.run_until(std::chrono::steady_clock::now() + 5s, nullptr);
    REQUIRE_MESSAGE(ex[c].ok, ex[c].error);
    CHECK(ex[c].payload == chunks[7]);
  }
  // A node that is gone: the call fails at once, naming it.
  bulk_endpoint gone = s.endpoint;
  s.server.reset();
  {
    bulk_exchange ex(pool, 1s);
    size_t c = ex.add(gone, {bulk_op::get, 0, keys[0], 0, {}});
    ex.run_until(std::chrono::steady_clock::now() + 5s, nullptr);
    CHECK(ex[c].done);
    CHECK_FALSE(ex[c].ok);
    CHECK(ex[c].error.find("node-0 (127.0.0.1:") != std::string::npos);
  }
}

TEST_CASE("bulk: bad frames from another process get an error naming the problem, the node keeps serving") {
  served_store s;
  struct bad_case {
    const char* name;
    uint32_t declared;  // 0: the body's size
    std::vector<uint8_t> body;
    const char* expect;
  };
  std::vector<bad_case> cases = {
    {"not msgpack", 0, {0xc1, 0xc1, 0xc1}, "not valid msgpack"},
    {"over the limit", (1u << 20) + 4096, {}, "over the limit"},
    {"not an array", 0, {0x01}, "is not a msgpack array of 9 fields"},
    {"too few fields", 0, request_with(-1, nullptr, 8), "has 8 fields, expected 9"},
    {"bad magic", 0, request_with(0, [](auto& pk) { pk.pack(std::string_view("nope")); }), "magic"},
    {"bad version", 0, request_with(1, [](auto& pk) { pk.pack(uint64_t{9}); }), "version 9"},
    {"bad op", 0, request_with(2, [](auto& pk) { pk.pack(std::string_view("delete")); }), "op \"delete\""},
    {"id not a number", 0, request_with(3, [](auto& pk) { pk.pack(std::string_view("x")); }), "field 3 (id) is not an unsigned integer"},
    {"index out of range", 0, request_with(6, [](auto& pk) { pk.pack(uint64_t{300}); }), "chunk index 300"},
    {"unknown class", 0, request_with(7, [](auto& pk) { pk.pack(uint64_t{9}); }), "traffic class 9"},
    {"get with payload", 0, request_with(8, [](auto& pk) { pk.pack_bin(2); pk.pack_bin_body("ab", 2); }),
     "get carries a payload"},
    {"put without chunk", 0, request_with(2, [](auto& pk) { pk.pack(std::string_view("put")); }), "empty chunk"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.name);
    int fd = raw_connect(s.endpoint.port);
    send_raw(fd, c.declared ? c.declared : static_cast<uint32_t>(c.body.size()), c.body);
    auto r = read_raw(fd);
    ::close(fd);
    REQUIRE(r.reply);
    CHECK(r.reply->status == bulk_invalid_request);
    CHECK_MESSAGE(r.reply->message.find(c.expect) != std::string::npos, r.reply->message);
    CHECK(r.closed);
  }
  // A request for a chunk the node does not hold is a per-request error, the connection stays.
  {
    int fd = raw_connect(s.endpoint.port);
    send_raw(fd, 0, {});  // an empty frame
    auto r = read_raw(fd);
    ::close(fd);
    REQUIRE(r.reply);
    CHECK(r.reply->message.find("frame is empty") != std::string::npos);
  }
  // Still serving: a put and a get through a client.
  bulk_pool pool;
  auto k = key_of(5, 3);
  auto chunk = bytes_of(k, 4000);
  bulk_exchange ex(pool, 1s);
  size_t put = ex.add(s.endpoint, {bulk_op::put, 0, k, 0, chunk});
  ex.run_until(std::chrono::steady_clock::now() + 5s, nullptr);
  CHECK_MESSAGE(ex[put].ok, ex[put].error);
  size_t get = ex.add(s.endpoint, {bulk_op::get, 0, k, 0, {}});
  ex.run_until(std::chrono::steady_clock::now() + 5s, nullptr);
  REQUIRE_MESSAGE(ex[get].ok, ex[get].error);
  CHECK(ex[get].payload == chunk);
  CHECK(s.store->stats().chunks == 1);
}

TEST_CASE("bulk: request and reply frames round-trip, truncated or padded ones are refused") {
  chunk_key k{{.lo = 0x5678, .hi = 0x1234}, 9};
  std::vector<uint8_t> chunk = {1, 2, 3, 4, 5};
  auto head = encode_request_head({bulk_op::put, 42, k, 1, chunk});
  auto body = head;
  body.insert(body.end(), chunk.begin(), chunk.end());
  auto r = parse_request(body);
  REQUIRE_MESSAGE(r, r.error());
  CHECK(r->op == bulk_op::put);
  CHECK(r->id == 42);
  CHECK(r->key == k);
  CHECK(r->traffic_class == 1);
  CHECK(std::vector<uint8_t>(r->payload.begin(), r->payload.end()) == chunk);
  auto truncated = body;
  truncated.pop_back();
  CHECK_FALSE(parse_request(truncated));
  auto padded = body;
  padded.push_back(0);
  auto p = parse_request(padded);
  REQUIRE_FALSE(p);
  CHECK(p.error().find("trailing") != std::string::npos);

  bulk_reply rep{42, 3, "chunk is corrupt", {9, 8, 7}};
  auto rb = encode_reply(rep);
  auto back = parse_reply(rb);
  REQUIRE_MESSAGE(back, back.error());
  CHECK(back->id == 42);
  CHECK(back->status == 3);
  CHECK(back->message == "chunk is corrupt");
  CHECK(back->payload == rep.payload);
  CHECK_FALSE(parse_reply({rb.data(), rb.size() - 1}));
}

TEST_CASE("bulk: a node that stops reading fails the sends after the send timeout instead of blocking") {
  // A listener that never accepts: the kernel completes the connection and buffers what it can,
  // then the client's sends stall.
  shoal::test::hung_listener listener(4);
  bulk_endpoint hung{"hung", "127.0.0.1", listener.port};
  bulk_pool pool;
  std::vector<uint8_t> chunk(1 << 20, 0x5a);
  bulk_exchange ex(pool, 1s, 200ms);
  std::vector<size_t> calls;
  for (uint64_t i = 0; i < 64; ++i) calls.push_back(ex.add(hung, {bulk_op::put, 0, key_of(i), 0, chunk}));
  ex.run_until(std::chrono::steady_clock::now() + 300ms, nullptr);
  size_t failed = 0;
  std::string why;
  for (size_t c : calls)
    if (ex[c].done && !ex[c].ok) {
      ++failed;
      why = ex[c].error;
    }
  CHECK(failed > 0);  // 64 MiB cannot all sit in socket buffers
  CHECK_MESSAGE(why.find("send timed out after 200 ms") != std::string::npos, why);
}
