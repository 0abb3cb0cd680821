// trainer/dist/store.*: the bootstrap TCP store between real processes (fork()ed from the test,
// one per rank, on a free port of this machine): set/get and barriers on 2 and 4 ranks, the
// bootstrap communicator's broadcast, and the launch errors every rank must report by name: a
// rank that never arrives (the deadline), mismatched WORLD_SIZE, a duplicate RANK, a busy
// MASTER_PORT, nothing listening at MASTER_ADDR:MASTER_PORT.
#include "trainer/dist/store.hpp"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <thread>
#include <string>
#include <vector>

#include "common/tcp_port.hpp"
#include "tier/error.hpp"

namespace {

using namespace ght::dist;
using ght::test::free_tcp_port;
using std::chrono::duration;

// One process's outcome: how it ended and what it said.
struct Outcome {
  enum Kind { ok, config_error, timeout_error, other_error } kind = other_error;
  std::string message;
};
std::string kind_text(Outcome::Kind k) {
  static const char* names[] = {"ok", "config_error", "timeout_error", "other error"};
  return names[k];
}

// Runs body(i) in a fork()ed child per entry and collects the outcomes in order. A child never
// returns into the test: it reports through a pipe and _exit()s.
std::vector<Outcome> in_processes(int n, const std::function<void(int)>& body) {
  std::vector<pid_t> pids;
  std::vector<int> pipes;
  for (int i = 0; i < n; ++i) {
    int p[2];
    if (::pipe(p) != 0) throw std::runtime_error("pipe failed");
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(p[0]);
      Outcome::Kind kind = Outcome::ok;
      std::string msg;
      try {
        body(i);
      } catch (const ght::config_error& e) {
        kind = Outcome::config_error;
        msg = e.what();
      } catch (const ght::dist::timeout_error& e) {
        kind = Outcome::timeout_error;
        msg = e.what();
      } catch (const std::exception& e) {
        kind = Outcome::other_error;
        msg = e.what();
      }
      const std::string out = std::string(1, static_cast<char>('0' + kind)) + msg;
      (void)!::write(p[1], out.data(), out.size());
      ::close(p[1]);
      ::_exit(0);
    }
    ::close(p[1]);
    pids.push_back(pid);
    pipes.push_back(p[0]);
  }
  std::vector<Outcome> out(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    std::string text;
    char buf[4096];
    for (ssize_t k; (k = ::read(pipes[static_cast<std::size_t>(i)], buf, sizeof buf)) > 0;) text.append(buf, static_cast<std::size_t>(k));
    ::close(pipes[static_cast<std::size_t>(i)]);
    int status = 0;
    ::waitpid(pids[static_cast<std::size_t>(i)], &status, 0);
    if (text.empty()) {
      out[static_cast<std::size_t>(i)] = {Outcome::other_error, "the process died without a report"};
    } else {
      out[static_cast<std::size_t>(i)] = {static_cast<Outcome::Kind>(text[0] - '0'), text.substr(1)};
    }
  }
  return out;
}

void expect_ok(const std::vector<Outcome>& o) {
  for (std::size_t i = 0; i < o.size(); ++i) {
    EXPECT_EQ(o[i].kind, Outcome::ok) << "process " << i << ": " << kind_text(o[i].kind) << ": " << o[i].message;
  }
}

void expect_error(const Outcome& o, Outcome::Kind kind, const std::vector<std::string>& parts, int i) {
  EXPECT_EQ(o.kind, kind) << "process " << i << " ended with " << kind_text(o.kind) << ": " << o.message;
  if (i == 0) std::printf("process 0: %s: %s\n", kind_text(o.kind).c_str(), o.message.c_str());
  for (const std::string& p : parts) {
    EXPECT_NE(o.message.find(p), std::string::npos) << "process " << i << ": \"" << p << "\" missing in: " << o.message;
  }
}

void require(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

class StoreRanks : public testing::TestWithParam<int> {};

TEST_P(StoreRanks, SetGetBarrierAndBroadcast) {
  const int n = GetParam(), port = free_tcp_port();
  const auto out = in_processes(n, [&](int rank) {
    TcpStore s("127.0.0.1", port, rank, n, duration<double>(20));
    require(s.rank() == rank && s.size() == n, "rank and size");
    s.set("from/" + std::to_string(rank), "hello from " + std::to_string(rank));
    for (int r = 0; r < n; ++r) {
      const std::string v = s.get("from/" + std::to_string(r), r);
      require(v == "hello from " + std::to_string(r), "get from/" + std::to_string(r) + " gave \"" + v + "\"");
    }
    s.barrier("after-gets");
    // Overwrites, values with NUL bytes, and a key set after another rank started waiting.
    if (rank == n - 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      s.set("late", std::string("a\0b", 3));
      s.set("late", std::string("x\0y", 3));
    }
    s.barrier("after-late");
    require(s.get("late") == std::string("x\0y", 3), "the overwritten value");
    // The bootstrap communicator: a broadcast from every root, and its barrier.
    const auto c = make_store_communicator(s);
    require(c->name() == "tcp-store" && c->rank() == rank && c->size() == n, "communicator rank and size");
    for (int root = 0; root < n; ++root) {
      std::vector<unsigned char> buf(1000, 0);
      if (rank == root) {
        for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<unsigned char>(i * 7 + static_cast<std::size_t>(root));
      }
      c->broadcast(buf.data(), buf.size(), root);
      for (std::size_t i = 0; i < buf.size(); ++i) {
        require(buf[i] == static_cast<unsigned char>(i * 7 + static_cast<std::size_t>(root)), "broadcast byte");
      }
    }
    c->barrier();
    float x = 1;
    bool refused = false;
    try {
      c->allreduce_sum(&x, 1);
    } catch (const ght::logic_error& e) {
      refused = std::string(e.what()).find("not data") != std::string::npos;
    }
    require(refused, "the store communicator must refuse data collectives");
    s.barrier("done");
  });
  expect_ok(out);
}

INSTANTIATE_TEST_SUITE_P(Ranks, StoreRanks, testing::Values(2, 4));

TEST(Store, ARankThatNeverArrivesIsNamedAtTheDeadline) {
  const int port = free_tcp_port();
  // World size 3, ranks 0 and 1 only: both time out in the join barrier naming rank 2.
  const auto out = in_processes(2, [&](int rank) { TcpStore s("127.0.0.1", port, rank, 3, duration<double>(1)); });
  const std::string addr = "127.0.0.1:" + std::to_string(port);
  for (int i = 0; i < 2; ++i) {
    expect_error(out[static_cast<std::size_t>(i)], Outcome::timeout_error,
                 {"rank 2 of 3 never arrived within 1 s", addr, "GHT_DIST_TIMEOUT"}, i);
  }
}

TEST(Store, AGetThatNobodySetsNamesTheKeyAndTheRank) {
  const int port = free_tcp_port();
  const auto out = in_processes(2, [&](int rank) {
    TcpStore s("127.0.0.1", port, rank, 2, duration<double>(1));
    if (rank == 1) (void)s.get("never", 0);
    if (rank == 0) std::this_thread::sleep_for(std::chrono::seconds(2));  // serving while rank 1 waits
  });
  expect_ok({out[0]});
  expect_error(out[1], Outcome::timeout_error, {"get \"never\"", "waited for rank 0, which never set it", "127.0.0.1:"}, 1);
}

TEST(Store, RankZeroLeavingEndsTheOthersWaitsNamingIt) {
  const int port = free_tcp_port();
  const auto out = in_processes(2, [&](int rank) {
    // Rank 0 leaves at once: its server serves on for min(its deadline, 30 s), then closes.
    TcpStore s("127.0.0.1", port, rank, 2, duration<double>(rank == 0 ? 1 : 20));
    if (rank == 1) (void)s.get("never", 0);
  });
  expect_ok({out[0]});
  expect_error(out[1], Outcome::other_error, {"rank 0 stopped serving the store", "while this rank waited for never"}, 1);
}

TEST(Store, MismatchedWorldSizeFailsEveryRankNamingWorldSize) {
  const int port = free_tcp_port();
  const auto out = in_processes(2, [&](int rank) {
    TcpStore s("127.0.0.1", port, rank, rank == 0 ? 2 : 3, duration<double>(10));
  });
  for (int i = 0; i < 2; ++i) {
    expect_error(out[static_cast<std::size_t>(i)], Outcome::config_error,
                 {"WORLD_SIZE differs", "rank 1", "WORLD_SIZE=3", "rank 0", "WORLD_SIZE=2"}, i);
  }
}

TEST(Store, TwoProcessesWithOneRankFailNamingRank) {
  const int port = free_tcp_port();
  const int ranks[] = {0, 1, 1};
  const auto out = in_processes(3, [&](int i) { TcpStore s("127.0.0.1", port, ranks[i], 3, duration<double>(10)); });
  for (int i = 0; i < 3; ++i) {
    expect_error(out[static_cast<std::size_t>(i)], Outcome::config_error, {"two processes have RANK=1", "WORLD_SIZE=3"}, i);
  }
}

TEST(Store, ABusyPortIsNamedAsMasterPort) {
  // Something else listens on the port: rank 0 cannot serve there.
  const ght::test::BoundPort busy(true);
  const int port = busy.port;
  try {
    TcpStore s("127.0.0.1", port, 0, 2, duration<double>(1));
    ADD_FAILURE() << "rank 0 served on a busy port";
  } catch (const ght::config_error& e) {
    EXPECT_NE(std::string(e.what()).find("MASTER_PORT=" + std::to_string(port)), std::string::npos) << e.what();
  }
}

// Under torchrun's agent (Launch::store_port = MASTER_PORT + 1) the messages name MASTER_PORT+1.
TEST(Store, TheLaunchsStorePortIsUsedAndNamed) {
  const ght::test::BoundPort busy(true);
  Launch l;
  l.launcher = Launcher::torchrun;
  l.world_size = 2;
  l.master_addr = "127.0.0.1";
  l.master_port = busy.port - 1;
  l.store_port = busy.port;
  try {
    TcpStore s(l, duration<double>(1));
    ADD_FAILURE() << "rank 0 served on a busy port";
  } catch (const ght::config_error& e) {
    EXPECT_NE(std::string(e.what()).find("MASTER_PORT+1=" + std::to_string(busy.port)), std::string::npos) << e.what();
  }
}

TEST(Store, NothingListeningAtTheAddressIsNamedAtTheDeadline) {
  const int port = free_tcp_port();
  try {
    TcpStore s("127.0.0.1", port, 1, 2, duration<double>(1));
    ADD_FAILURE() << "rank 1 joined a store nobody serves";
  } catch (const ght::config_error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("MASTER_ADDR:MASTER_PORT = 127.0.0.1:" + std::to_string(port)), std::string::npos) << m;
    EXPECT_NE(m.find("within 1 s"), std::string::npos) << m;
  }
}

TEST(Store, BadArgumentsNameTheirVariable) {
  auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const ght::config_error& e) {
      return std::string(e.what());
    }
    return std::string("(no config_error)");
  };
  EXPECT_NE(message([] { TcpStore s("127.0.0.1", 0, 0, 2); }).find("MASTER_PORT=0"), std::string::npos);
  EXPECT_NE(message([] { TcpStore s("127.0.0.1", 29500, 2, 2); }).find("RANK=2"), std::string::npos);
  EXPECT_NE(message([] { TcpStore s("", 29500, 1, 2); }).find("MASTER_ADDR"), std::string::npos);
  TcpStore one("127.0.0.1", free_tcp_port(), 0, 1, duration<double>(5));  // a world of one works alone
  one.set("k", "v");
  EXPECT_EQ(one.get("k"), "v");
  one.barrier("alone");
  EXPECT_THROW(one.set("big", std::string(kStoreMaxValueBytes + 1, 'x')), ght::logic_error);
}

}  // namespace
