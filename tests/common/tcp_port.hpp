#pragma once
// TCP ports for tests of the bootstrap store (trainer/dist/store.hpp): a socket bound to a port
// the kernel picks (port 0, every interface), and a port nothing listens on right now.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

namespace ght::test {

/// Bound to a free port while it lives (listening when `listen` is true).
struct BoundPort {
  explicit BoundPort(bool listen) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t len = sizeof a;
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || (listen && ::listen(fd, 1) != 0) ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      throw std::runtime_error(std::string("no free TCP port: ") + std::strerror(errno));
    }
    port = ntohs(a.sin_port);
  }
  ~BoundPort() { ::close(fd); }
  BoundPort(const BoundPort&) = delete;
  BoundPort& operator=(const BoundPort&) = delete;
  int fd = -1;
  int port = 0;
};

/// A port nothing listens on right now (bound, read back, released: another process could take
/// it before the test does, which is unlikely enough for a test).
inline int free_tcp_port() { return BoundPort(false).port; }

}  // namespace ght::test
