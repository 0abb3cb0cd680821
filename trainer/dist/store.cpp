// The bootstrap TCP store (store.hpp): rank 0's server (a thread per connection, the keys under
// one mutex) and every rank's client (one connection, one request at a time).
#include "trainer/dist/store.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "tier/config.hpp"
#include "tier/error.hpp"

namespace ght::dist {

namespace {

using Clock = std::chrono::steady_clock;

// Requests and the server's answers.
constexpr char kHello = 'H', kSet = 'S', kGet = 'G', kWait = 'W';
constexpr char kOk = 'O', kTimedOut = 'T', kError = 'E', kClosed = 'C';
constexpr std::size_t kMaxFields = 4096;  // a barrier's keys: one per rank

std::string errno_text(int e) { return std::strerror(e); }

std::string seconds_text(std::chrono::duration<double> d) {
  char b[32];
  std::snprintf(b, sizeof b, "%.0f", d.count());
  return b;
}

long long to_ms(std::chrono::duration<double> d) {
  return std::max<long long>(0, static_cast<long long>(d.count() * 1000.0));
}

int parse_int(std::string_view s) {
  int v = 0;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  GHT_EXPECTS(ec == std::errc() && p == s.data() + s.size(), "TCP store: malformed number \"" + std::string(s) + "\"");
  return v;
}

// A message: one op (or status) byte, a field count, then each field as a length and its bytes
// (32-bit little-endian lengths).
void put_u32(std::string& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFFu));
}
std::uint32_t get_u32(const char* p) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}
std::string encode(char op, const std::vector<std::string>& fields) {
  std::string out(1, op);
  put_u32(out, static_cast<std::uint32_t>(fields.size()));
  for (const std::string& f : fields) {
    put_u32(out, static_cast<std::uint32_t>(f.size()));
    out += f;
  }
  return out;
}

bool send_all(int fd, const std::string& data) {
  std::size_t at = 0;
  while (at < data.size()) {
    const ssize_t n = ::send(fd, data.data() + at, data.size() - at, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    at += static_cast<std::size_t>(n);
  }
  return true;
}

enum class Read { ok, eof, timed_out };

// `len` bytes, waiting until `deadline` (none: Clock::time_point::max()).
Read recv_all(int fd, char* buf, std::size_t len, Clock::time_point deadline) {
  std::size_t at = 0;
  while (at < len) {
    int wait_ms = -1;
    if (deadline != Clock::time_point::max()) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return Read::timed_out;
      wait_ms = static_cast<int>(std::min<long long>(left, 1000));
    }
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, wait_ms);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Read::eof;
    if (r == 0) continue;
    const ssize_t n = ::recv(fd, buf + at, len - at, 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return Read::eof;
    at += static_cast<std::size_t>(n);
  }
  return Read::ok;
}

struct Message {
  char op = 0;
  std::vector<std::string> fields;
};

Read read_message(int fd, Message& m, Clock::time_point deadline) {
  char head[5];
  if (const Read r = recv_all(fd, head, 5, deadline); r != Read::ok) return r;
  m.op = head[0];
  const std::uint32_t count = get_u32(head + 1);
  if (count > kMaxFields) return Read::eof;  // not our protocol: drop the connection
  m.fields.assign(count, {});
  for (std::string& f : m.fields) {
    char len[4];
    if (const Read r = recv_all(fd, len, 4, deadline); r != Read::ok) return r;
    const std::uint32_t n = get_u32(len);
    if (n > kStoreMaxValueBytes + 4096) return Read::eof;
    f.resize(n);
    if (const Read r = recv_all(fd, f.data(), n, deadline); r != Read::ok) return r;
  }
  return Read::ok;
}

std::string this_host() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "unknown-host";
  return buf;
}

// The ranks a barrier's missing keys ("<prefix><rank>") name, as "rank 2" or "ranks 2, 3".
std::string ranks_text(const std::vector<std::string>& missing, std::size_t prefix) {
  std::string s = missing.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < missing.size(); ++i) {
    if (i > 0) s += ", ";
    s += missing[i].substr(prefix);
  }
  return s;
}

}  // namespace

// ---- rank 0's server ----------------------------------------------------------------------------

class TcpStore::Server {
 public:
  Server(int port, const std::string& port_name, int world, std::string address, std::chrono::duration<double> linger)
      : world_(world), address_(std::move(address)), linger_(linger) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listen_fd_ < 0) throw comm_error("TCP store: socket() failed: " + errno_text(errno));
    const int one = 1;
    (void)::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(listen_fd_, 256) != 0) {
      const int e = errno;
      ::close(listen_fd_);
      throw ght::config_error(port_name + "=" + std::to_string(port) + ": rank 0 cannot serve the bootstrap store on "
                              "TCP port " + std::to_string(port) + " (" + errno_text(e) +
                              "); pick a free port (the same MASTER_PORT on every rank)");
    }
    acceptor_ = std::thread([this] { accept_loop(); });
  }

  ~Server() {
    std::unique_lock lock(mu_);
    // The other ranks may still be in their last request (the barrier rank 0 has just left):
    // serve until they close their connections, for at most `linger_`.
    cv_.wait_for(lock, linger_, [&] { return open_ == 0; });
    stop_ = true;
    cv_.notify_all();
    // Requests in flight get their answer (a barrier the last rank just completed) before the
    // connections close.
    cv_.wait_for(lock, std::chrono::seconds(2), [&] { return busy_ == 0; });
    for (int fd : fds_) ::shutdown(fd, SHUT_RDWR);
    lock.unlock();
    ::shutdown(listen_fd_, SHUT_RDWR);
    if (acceptor_.joinable()) acceptor_.join();
    ::close(listen_fd_);
    for (std::thread& t : handlers_) t.join();
    for (int fd : fds_) ::close(fd);
  }
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

 private:
  void accept_loop() {
    for (;;) {
      pollfd p{listen_fd_, POLLIN, 0};
      const int r = ::poll(&p, 1, 100);
      {
        std::lock_guard lock(mu_);
        if (stop_) return;
      }
      if (r <= 0) continue;
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      const int one = 1;
      (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      std::lock_guard lock(mu_);
      if (stop_) {
        ::close(fd);
        return;
      }
      fds_.push_back(fd);
      ++open_;
      handlers_.emplace_back([this, fd] {
        serve(fd);
        std::lock_guard done(mu_);
        --open_;
        cv_.notify_all();
      });
    }
  }

  void serve(int fd) {
    for (;;) {
      Message m;
      if (read_message(fd, m, Clock::time_point::max()) != Read::ok) return;  // closed
      std::unique_lock lock(mu_);
      ++busy_;
      std::string reply;
      try {
        reply = answer(m, lock);
      } catch (const std::exception& e) {  // a malformed request: this thread must not end the process
        reply = encode(kError, {std::string("TCP store: bad request: ") + e.what()});
      }
      lock.unlock();
      const bool sent = send_all(fd, reply);
      lock.lock();
      --busy_;
      cv_.notify_all();
      if (!sent) return;
    }
  }

  // Under the lock (waits release it).
  std::string answer(const Message& m, std::unique_lock<std::mutex>& lock) {
    const auto& f = m.fields;
    if (!fatal_.empty()) return encode(kError, {fatal_});
    switch (m.op) {
      case kHello: {
        if (f.size() != 3) break;
        const int rank = parse_int(f[0]), world = parse_int(f[1]);
        if (world != world_) {
          fail("WORLD_SIZE differs between the processes of the launch: rank " + f[0] + " (" + f[2] +
               ") has WORLD_SIZE=" + f[1] + ", rank 0 (which serves the store at " + address_ +
               ") has WORLD_SIZE=" + std::to_string(world_) + "; every process must get the same WORLD_SIZE");
          return encode(kError, {fatal_});
        }
        if (const auto it = joined_.find(rank); it != joined_.end()) {
          fail("two processes have RANK=" + f[0] + " (" + it->second + ", and " + f[2] + ") in a launch of WORLD_SIZE=" +
               std::to_string(world_) + " (the store at " + address_ + "); each process needs its own RANK in 0.." +
               std::to_string(world_ - 1));
          return encode(kError, {fatal_});
        }
        joined_.emplace(rank, f[2]);
        return encode(kOk, {});
      }
      case kSet:
        if (f.size() != 2) break;
        kv_[f[0]] = f[1];
        cv_.notify_all();
        return encode(kOk, {});
      case kGet:
      case kWait: {
        if (f.empty()) break;
        const auto deadline = Clock::now() + std::chrono::milliseconds(parse_int(f[0]));
        const std::vector<std::string> keys(f.begin() + 1, f.end());
        auto missing = [&] {
          std::vector<std::string> out;
          for (const std::string& k : keys) {
            if (kv_.find(k) == kv_.end()) out.push_back(k);
          }
          return out;
        };
        cv_.wait_until(lock, deadline, [&] { return stop_ || !fatal_.empty() || missing().empty(); });
        if (!fatal_.empty()) return encode(kError, {fatal_});
        std::vector<std::string> left = missing();
        if (!left.empty() && stop_) {
          return encode(kClosed, {"rank 0 stopped serving the store at " + address_ +
                                 " (it finished or failed: see its output) while this rank waited for " +
                                 left.front()});
        }
        if (!left.empty()) return encode(kTimedOut, left);
        if (m.op == kGet && keys.size() == 1) return encode(kOk, {kv_[keys[0]]});
        return encode(kOk, {});
      }
      default: break;
    }
    return encode(kError, {"TCP store: malformed request (a process that is not this build of ght?)"});
  }

  void fail(std::string why) {
    fatal_ = std::move(why);
    cv_.notify_all();
  }

  int listen_fd_ = -1;
  int world_;
  std::string address_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> kv_;
  std::map<int, std::string> joined_;  // rank -> "host h, pid p"
  std::string fatal_;                  // a launch error: every request from now on gets it
  bool stop_ = false;
  int busy_ = 0;                       // requests being answered
  int open_ = 0;                       // connections not yet closed by their rank
  std::chrono::duration<double> linger_;
  std::vector<int> fds_;
  std::vector<std::thread> handlers_;
  std::thread acceptor_;
};

// ---- every rank's client ------------------------------------------------------------------------

struct TcpStore::Reply {
  char status = 0;
  std::vector<std::string> fields;
};

TcpStore::TcpStore(const Launch& l, std::chrono::duration<double> timeout)
    : TcpStore(l.master_addr, l.store_port > 0 ? l.store_port : l.master_port, l.rank, l.world_size, timeout,
               l.store_port > 0 && l.store_port != l.master_port ? "MASTER_PORT+1" : "MASTER_PORT") {}

TcpStore::TcpStore(std::string addr, int port, int rank, int world_size, std::chrono::duration<double> timeout,
                   std::string port_name)
    : addr_(std::move(addr)), port_(port), port_name_(std::move(port_name)), rank_(rank), world_(world_size),
      timeout_(timeout) {
  if (world_ < 1) throw ght::config_error("WORLD_SIZE=" + std::to_string(world_) + ": must be at least 1");
  if (rank_ < 0 || rank_ >= world_) {
    throw ght::config_error("RANK=" + std::to_string(rank_) + ": not in 0.." + std::to_string(world_ - 1) +
                            " (WORLD_SIZE=" + std::to_string(world_) + ")");
  }
  if (port_ < 1 || port_ > 65535) {
    throw ght::config_error(port_name_ + "=" + std::to_string(port_) + ": not a TCP port (1..65535)");
  }
  if (addr_.empty()) throw ght::config_error("MASTER_ADDR is empty: set it to rank 0's host name or address");
  if (timeout_.count() <= 0) {
    timeout_ = std::chrono::duration<double>(config::cfg().get_float(config::Key::GHT_DIST_TIMEOUT));
  }
  if (rank_ == 0) {
    server_ = std::make_unique<Server>(port_, port_name_, world_, address(),
                                       std::min(timeout_, std::chrono::duration<double>(30)));
  }
  try {
    connect_to_server();
    const Reply r = request(kHello, {std::to_string(rank_), std::to_string(world_),
                                     "host " + this_host() + ", pid " + std::to_string(::getpid())},
                            timeout_);
    if (r.status != kOk) {
      throw ght::config_error(r.fields.empty() ? "TCP store: refused" : r.fields[0]);
    }
    barrier("join");
  } catch (...) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    throw;
  }
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);
  server_.reset();  // rank 0: serves until the others have closed (bounded), then stops
}

std::string TcpStore::address() const { return addr_ + ":" + std::to_string(port_); }

std::string TcpStore::where() const {
  return " (rank " + std::to_string(rank_) + " of " + std::to_string(world_) + ", the store at " + address() + ")";
}

void TcpStore::connect_to_server() {
  // Rank 0 reaches its own server over loopback; the others at MASTER_ADDR.
  const std::string host = rank_ == 0 ? "127.0.0.1" : addr_;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int gai = ::getaddrinfo(host.c_str(), std::to_string(port_).c_str(), &hints, &res);
  if (gai != 0) {
    throw ght::config_error("MASTER_ADDR=" + addr_ + ": rank " + std::to_string(rank_) +
                            " cannot resolve it (" + ::gai_strerror(gai) + "); set it to rank 0's host name or address");
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> list(res, &::freeaddrinfo);
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(timeout_);
  std::string last = "no address";
  // Rank 0 may not listen yet: retry until the deadline.
  for (;;) {
    for (const addrinfo* ai = list.get(); ai != nullptr; ai = ai->ai_next) {
      const int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
      if (fd < 0) {
        last = errno_text(errno);
        continue;
      }
      int rc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
      int err = rc == 0 ? 0 : errno;
      if (rc != 0 && err == EINPROGRESS) {
        // An address that drops packets would hold a blocking connect for minutes.
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
        pollfd p{fd, POLLOUT, 0};
        const int pr = ::poll(&p, 1, static_cast<int>(std::clamp<long long>(left, 0, 2000)));
        err = ETIMEDOUT;
        if (pr > 0) {
          socklen_t len = sizeof err;
          if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
        }
      }
      if (err == 0) {
        const int flags = ::fcntl(fd, F_GETFL, 0);
        (void)::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
        const int one = 1;
        (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        fd_ = fd;
        return;
      }
      ::close(fd);
      last = errno_text(err);
    }
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  throw ght::config_error("rank " + std::to_string(rank_) + " could not connect to the bootstrap store at " +
                          "MASTER_ADDR:" + port_name_ + " = " + address() + " within " + seconds_text(timeout_) +
                          " s (last error: " + last + "); rank 0 serves it there: check that rank 0 is running, "
                          "that MASTER_ADDR is its address and that every rank has the same MASTER_PORT "
                          "(GHT_DIST_TIMEOUT sets the limit in seconds)");
}

TcpStore::Reply TcpStore::request(char op, const std::vector<std::string>& fields, std::chrono::duration<double> wait) {
  GHT_EXPECTS(fd_ >= 0, "TCP store: not connected" + where());
  if (!send_all(fd_, encode(op, fields))) {
    throw comm_error("lost the connection to the bootstrap store" + where() + ": " + errno_text(errno) +
                     "; rank 0, which serves it, has exited or failed (see its output)");
  }
  // The server answers a wait at its own deadline; this one only catches a server that is gone.
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(wait) + std::chrono::seconds(30);
  Message m;
  switch (read_message(fd_, m, deadline)) {
    case Read::ok: break;
    case Read::eof:
      throw comm_error("lost the connection to the bootstrap store" + where() +
                       "; rank 0, which serves it, has exited or failed (see its output)");
    case Read::timed_out:
      throw timeout_error("the bootstrap store did not answer" + where() + " within " + seconds_text(wait) +
                          " s and 30 s more (is rank 0 stuck?)");
  }
  // kError carries a launch error (WORLD_SIZE, RANK) that every rank reports alike.
  if (m.op == kError) throw ght::config_error(m.fields.empty() ? std::string("TCP store: refused") : m.fields[0]);
  if (m.op == kClosed) throw comm_error((m.fields.empty() ? std::string("the store closed") : m.fields[0]) + where());
  return {m.op, std::move(m.fields)};
}

void TcpStore::set(std::string_view key, std::string_view value) {
  GHT_EXPECTS(value.size() <= kStoreMaxValueBytes,
              "TCP store: a value of " + std::to_string(value.size()) + " bytes for \"" + std::string(key) +
                  "\"; the bootstrap store takes at most " + std::to_string(kStoreMaxValueBytes) +
                  " (it is not a data transport)");
  (void)request(kSet, {std::string(key), std::string(value)}, timeout_);
}

std::string TcpStore::get(std::string_view key, int from) {
  const Reply r = request(kGet, {std::to_string(to_ms(timeout_)), std::string(key)}, timeout_);
  if (r.status == kOk && r.fields.size() == 1) return r.fields[0];
  throw timeout_error("bootstrap store get \"" + std::string(key) + "\"" + where() + ": nobody set it within " +
                      seconds_text(timeout_) + " s" +
                      (from >= 0 ? "; it waited for rank " + std::to_string(from) + ", which never set it" : "") +
                      " (it failed, is stuck, or is elsewhere: see its output). GHT_DIST_TIMEOUT sets the limit in "
                      "seconds");
}

void TcpStore::barrier(std::string_view name) {
  const std::string prefix = "barrier/" + std::string(name) + "/" + std::to_string(++barriers_) + "/";
  set(prefix + std::to_string(rank_), "");
  std::vector<std::string> fields{std::to_string(to_ms(timeout_))};
  for (int r = 0; r < world_; ++r) fields.push_back(prefix + std::to_string(r));
  const Reply reply = request(kWait, fields, timeout_);
  if (reply.status == kOk) return;
  throw timeout_error("bootstrap store barrier \"" + std::string(name) + "\"" + where() + ": " +
                      ranks_text(reply.fields, prefix.size()) + " of " + std::to_string(world_) +
                      " never arrived within " + seconds_text(timeout_) +
                      " s (not started, failed, or stuck: see their output; each needs RANK, WORLD_SIZE, "
                      "MASTER_ADDR and MASTER_PORT). GHT_DIST_TIMEOUT sets the limit in seconds");
}

// ---- the bootstrap communicator -------------------------------------------------------------------

namespace {

class StoreCommunicator final : public Communicator {
 public:
  explicit StoreCommunicator(TcpStore& s) : Communicator(s.rank(), s.size(), s.timeout()), store_(s) {}
  [[nodiscard]] std::string name() const override { return "tcp-store"; }

 protected:
  [[noreturn]] static void refuse(const char* op) {
    throw ght::logic_error(std::string(op) + " over the bootstrap TCP store: it moves bootstrap values only "
                                             "(broadcast, barrier), not data; data collectives need MPI or NCCL");
  }
  void do_allreduce_sum(void*, std::size_t, Type) override { refuse("allreduce_sum"); }
  void do_reduce_scatter_sum(void*, std::span<const std::size_t>, Type) override { refuse("reduce_scatter_sum"); }
  void do_all_gather(void*, std::span<const std::size_t>, Type) override { refuse("all_gather"); }
  void do_start_allreduce_sum(void*, std::size_t, Type) override { refuse("start_allreduce_sum"); }
  bool do_test_allreduce() override { return true; }
  void do_wait_allreduce() override {}

  void do_broadcast(void* data, std::size_t bytes, int root) override {
    const std::string key = "broadcast/" + std::to_string(calls_);
    if (rank() == root) {
      store_.set(key, std::string_view(static_cast<const char*>(data), bytes));
      return;
    }
    const std::string v = store_.get(key, root);
    GHT_EXPECTS(v.size() == bytes, "broadcast over the bootstrap store (" + key + "): rank " + std::to_string(root) +
                                       " sent " + std::to_string(v.size()) + " bytes, rank " + std::to_string(rank()) +
                                       " expected " + std::to_string(bytes));
    std::memcpy(data, v.data(), bytes);
  }

  void do_barrier() override { store_.barrier("communicator"); }

 private:
  TcpStore& store_;
};

}  // namespace

std::unique_ptr<Communicator> make_store_communicator(TcpStore& store) {
  return std::make_unique<StoreCommunicator>(store);
}

}  // namespace ght::dist
