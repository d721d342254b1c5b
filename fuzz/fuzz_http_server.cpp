// libFuzzer target: bytes from a client socket into the gateway's HTTP server (actors/
// http_server: Beast's parser with the gateway's limits, keep-alive, the request handed to a
// handler). The server runs once, on a loopback port, with a handler that parses
// /v1/completions and /v1/chat/completions bodies as the gateway does; each input is one
// connection: the bytes are sent, the write side closed, and every byte the server answers is
// read until it closes. Every response the server writes is a well-formed status line.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "actors/http_server.hpp"
#include "runtime/serve/openai_api.hpp"

namespace {

using namespace shoal;

uint16_t server_port() {
  static std::unique_ptr<actors::http_server> server = [] {
    runtime::api_limits limits;
    limits.model_ids = {"model"};
    limits.vocab_size = 1000;
    actors::http_server_options o;
    o.max_body_bytes = 1 << 16;
    o.idle_timeout_s = 2;
    o.error_body = [](int status, const std::string& message) { return to_json(runtime::invalid_request_error(message)); };
    auto s = actors::http_server::start(
        "127.0.0.1", 0,
        [limits](const actors::http_request& req, actors::http_writer& w) {
          const bool chat = req.target == "/v1/chat/completions";
          if (req.method != "POST" || (!chat && req.target != "/v1/completions")) {
            w.respond(404, "application/json", to_json(runtime::not_found_error("no route " + req.target)));
            return;
          }
          auto r = runtime::parse_completion_request(req.body, chat, limits);
          if (!r)
            w.respond(r.error().status, "application/json", to_json(r.error()));
          else
            w.respond(200, "application/json", "{}");
        },
        o);
    if (!s) std::abort();
    return std::move(*s);
  }();
  return server->port();
}

// A connection to the server from the next of 127.0.0.2 … 127.0.0.251: the server closes
// first, so each connection leaves a TIME_WAIT entry for its address pair, and one source
// address alone runs out of ephemeral ports after some 28,000 inputs.
int connect_to(uint16_t port) {
  static uint32_t next = 0;
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) std::abort();
  sockaddr_in from{};
  from.sin_family = AF_INET;
  from.sin_addr.s_addr = htonl(INADDR_LOOPBACK + 1 + (next++ % 250));
  if (bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof from) != 0) std::abort();
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    // libFuzzer's timers interrupt a connect now and then (EINTR): it goes on in the kernel;
    // wait until it is done and read its outcome.
    int err = errno;
    if (err == EINTR || err == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      while (poll(&p, 1, 5000) < 0 && errno == EINTR) {
      }
      socklen_t len = sizeof err;
      if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    }
    if (err != 0) {
      errno = err;
      std::perror("fuzz_http_server: connect");
      std::abort();
    }
  }
  return fd;
}

}  // namespace

// libFuzzer's leak check after each input (-detect_leaks) scans while the server's detached
// connection threads are mid-read and once reported a Beast read buffer, live on such a
// thread, as leaked (not reproducible from that input alone). The per-input check is off here;
// LeakSanitizer still checks the whole process when the run ends.
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  static std::vector<char*> args;
  args.assign(*argv, *argv + *argc);
  static char off[] = "-detect_leaks=0";
  args.insert(args.begin() + 1, off);  // a -detect_leaks given on the command line comes later and wins
  *argc = static_cast<int>(args.size());
  *argv = args.data();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = connect_to(server_port());
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  for (size_t done = 0; done < size;) {
    const ssize_t n = send(fd, data + done, size - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the server may close early (413, 400) before reading everything
    done += static_cast<size_t>(n);
  }
  shutdown(fd, SHUT_WR);
  std::string answer;
  char buf[4096];
  for (;;) {
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    answer.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  // Whatever it answered (possibly nothing, for a connection that sent no whole request)
  // begins with a status line.
  if (!answer.empty() && answer.rfind("HTTP/1.1 ", 0) != 0) std::abort();
  return 0;
}
