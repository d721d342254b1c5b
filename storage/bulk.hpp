// The storage nodes' bulk data path: chunk puts and gets over plain TCP, beside the CAF
// control path (ARCHITECTURE.md: bulk bytes do not travel as CAF messages). Each storage node
// serves its chunk store on a port of its own (bulk_server, a thread per connection); a client
// keeps a pool of connections per node and has many requests in flight on them at once
// (bulk_exchange, one poll loop in the calling thread).
//
// Wire format (v1): every frame is a 4-byte big-endian length, then that many bytes of one
// msgpack array.
//   request: ["shoal-kv", 1, op, request id, key hi, key lo, chunk index, traffic class, payload]
//            op "put" (payload: the chunk, bin) or "get" (payload: empty bin)
//   reply:   [request id, status, message, payload]
//            status 0 ok (get: the chunk in payload), else a store_errc + 1 (message says what)
// A frame over the server's limit or one that does not parse is answered with an error reply
// (request id 0, status invalid_request + message) and the connection is closed; the node keeps
// serving its other connections.
#pragma once

#include <chrono>
#include <cstdint>
#include <expected>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "storage/chunk_store.hpp"

namespace shoal::storage {

enum class bulk_op : uint8_t { put, get };

struct bulk_request {
  bulk_op op = bulk_op::get;
  uint64_t id = 0;
  chunk_key key;
  uint8_t traffic_class = 0;
  std::span<const uint8_t> payload;  // put: the chunk (not owned)
};

// Reply status codes besides store_errc + 1.
inline constexpr uint32_t bulk_ok = 0;
inline constexpr uint32_t bulk_invalid_request = 100;

struct bulk_reply {
  uint64_t id = 0;
  uint32_t status = bulk_ok;
  std::string message;
  std::vector<uint8_t> payload;
};

// Frame bodies (without the 4-byte length). encode_request_head packs everything but the put
// payload's bytes, which follow it on the wire as the bin's body (no copy of the chunk).
std::vector<uint8_t> encode_request_head(const bulk_request& r);
std::vector<uint8_t> encode_reply(const bulk_reply& r);
// Parses and validates a request body; the payload span points into `body`. Errors name the
// field ("chunk index 300 out of range [0, 254]").
struct parsed_request {
  bulk_op op;
  uint64_t id;
  chunk_key key;
  uint8_t traffic_class;
  std::span<const uint8_t> payload;
};
std::expected<parsed_request, std::string> parse_request(std::span<const uint8_t> body);
std::expected<bulk_reply, std::string> parse_reply(std::span<const uint8_t> body);

struct bulk_server_options {
  std::string host = "127.0.0.1";
  uint16_t port = 0;              // 0: any free port (port() says which)
  uint64_t max_frame_bytes = 0;   // 0: the store's max_chunk_bytes + 1 KiB
  int max_connections = 256;      // more are accepted and closed at once
};

// Serves `store` until destroyed (the destructor closes every connection and joins the threads).
class bulk_server {
 public:
  static std::expected<std::unique_ptr<bulk_server>, std::string> start(std::shared_ptr<chunk_store> store,
                                                                         bulk_server_options o);
  ~bulk_server();
  uint16_t port() const;
  struct impl;

 private:
  explicit bulk_server(std::shared_ptr<impl> p);
  std::shared_ptr<impl> impl_;  // shared with the connection threads
};

// A node the client talks to: where its bulk server listens.
struct bulk_endpoint {
  std::string name;  // for error messages
  std::string host;
  uint16_t port = 0;
};

// A client connection: the socket, replies still owed to requests nobody waits for any more
// (skipped when they arrive), and its receive buffer.
struct bulk_connection {
  int fd = -1;
  size_t stale = 0;
  std::unique_ptr<uint8_t[]> buf;
  size_t cap = 0, start = 0, end = 0;  // unparsed bytes: [start, end)
};

// Idle connections per endpoint, shared by the client's exchanges (thread-safe).
class bulk_pool {
 public:
  bulk_pool();
  ~bulk_pool();
  // A connection to `e` (an idle one when there is one), or an error naming the endpoint.
  std::expected<bulk_connection, std::string> take(const bulk_endpoint& e, std::chrono::milliseconds timeout);
  // Gives back a connection between frames (replies still owed are skipped by its next user).
  void give(const bulk_endpoint& e, bulk_connection c);
  struct impl;

 private:
  std::unique_ptr<impl> impl_;
};

// Requests to several endpoints in flight at once; replies are collected by run_until in the
// calling thread. A connection that failed fails every call on it. Calls still open when the
// exchange ends are abandoned: their replies are skipped by the connection's next user.
class bulk_exchange {
 public:
  struct result {
    bool done = false, ok = false;
    std::string error;              // when !ok: the endpoint and what failed
    std::vector<uint8_t> payload;   // get: the chunk
  };

  // connect_timeout bounds a connect; send_timeout a request's send (a node that stopped
  // reading, e.g. hung, fills the socket buffer: the send then fails instead of blocking).
  bulk_exchange(bulk_pool& pool, std::chrono::milliseconds connect_timeout,
                std::chrono::milliseconds send_timeout = std::chrono::seconds(5));
  ~bulk_exchange();
  bulk_exchange(const bulk_exchange&) = delete;
  bulk_exchange& operator=(const bulk_exchange&) = delete;

  // Sends the request now (connecting first when needed); returns the call's number.
  size_t add(const bulk_endpoint& e, bulk_request r);
  // Reads replies until `enough()` holds, every call is done, or `deadline`; calls not done by
  // the deadline fail with a timeout. `on_reply(call)` runs once per call as it completes.
  void run_until(std::chrono::steady_clock::time_point deadline, const std::function<bool()>& enough,
                 const std::function<void(size_t)>& on_reply = nullptr);
  // Fails every call still open (their connections are closed when the exchange ends).
  void finish(const std::string& why);
  const result& operator[](size_t call) const { return results_[call]; }
  result& operator[](size_t call) { return results_[call]; }
  size_t size() const { return results_.size(); }

 private:
  struct conn;
  conn& conn_for(const bulk_endpoint& e);
  void fail_conn(conn& c, const std::string& why);
  bool read_some(conn& c, const std::function<void(size_t)>& on_reply);

  bulk_pool& pool_;
  std::chrono::milliseconds connect_timeout_, send_timeout_;
  std::vector<std::unique_ptr<conn>> conns_;
  std::vector<result> results_;
};

}  // namespace shoal::storage
