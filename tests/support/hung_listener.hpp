// A loopback TCP listener that never accepts: the kernel completes connections and buffers
// what it can, nobody reads or answers (a hung process's port). Closed on destruction.
#pragma once

#include <cstdint>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <doctest/doctest.h>

namespace shoal::test {

struct hung_listener {
  int fd = -1;
  uint16_t port = 0;

  explicit hung_listener(int backlog = 64) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(fd, backlog) == 0);
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
  }
  ~hung_listener() { ::close(fd); }
  hung_listener(const hung_listener&) = delete;
  hung_listener& operator=(const hung_listener&) = delete;
};

}  // namespace shoal::test
