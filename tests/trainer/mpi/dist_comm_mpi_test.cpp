// The MPI communicator under `mpirun -np 2` (tests/CMakeLists.txt registers it only where MPI and
// mpirun exist). Every rank runs every test; each test's collectives match across ranks.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "tier/error.hpp"
#include "trainer/dist/comm.hpp"
#include "trainer/dist/detail/comm_mpi.hpp"
#include "trainer/dist/gpu_comm.hpp"
#include "trainer/dist/launch.hpp"

namespace {

using namespace ght::dist;

std::unique_ptr<Communicator> g_comm;  // one per process: MPI is initialised once

// Values that differ per rank and are not round (never test on zeros).
float value(int rank, std::size_t i) { return 0.37f * static_cast<float>(i + 1) + 1.5f * static_cast<float>(rank) + 0.01f; }

TEST(DistCommMpi, RankAndSizeMatchTheLaunch) {
  const Launch l = detect_launch(process_env());
  EXPECT_EQ(g_comm->name(), "mpi");
  EXPECT_EQ(g_comm->size(), 2);
  EXPECT_EQ(g_comm->rank(), l.rank);
}

TEST(DistCommMpi, AllreduceSumFloatAndDouble) {
  const int n = g_comm->size();
  for (std::size_t len : {std::size_t{1}, std::size_t{1000}, std::size_t{100003}}) {
    std::vector<float> f(len);
    std::vector<double> d(len);
    for (std::size_t i = 0; i < len; ++i) f[i] = value(g_comm->rank(), i), d[i] = 2.0 * value(g_comm->rank(), i);
    g_comm->allreduce_sum(f.data(), len);
    g_comm->allreduce_sum(d.data(), len);
    for (std::size_t i = 0; i < len; ++i) {
      float ef = 0;
      double ed = 0;
      for (int r = 0; r < n; ++r) ef += value(r, i), ed += 2.0 * value(r, i);
      ASSERT_EQ(f[i], ef) << "len " << len << " index " << i;  // two addends: exact in any order
      ASSERT_NEAR(d[i], ed, 1e-12 * std::abs(ed)) << "len " << len << " index " << i;
    }
  }
}

// Blocks of uneven sizes, one empty, through one MPI call each (the default) and in pieces of 7
// elements (the path of buffers beyond MPI's int counts).
class DistCommMpiBlocks : public testing::TestWithParam<std::size_t> {};

TEST_P(DistCommMpiBlocks, ReduceScatterSumAndAllGatherInPlace) {
  const int n = g_comm->size(), me = g_comm->rank();
  std::unique_ptr<Communicator> pieces;
  if (GetParam() != 0) {
    pieces = ght::dist::detail::make_mpi_communicator(detect_launch(process_env()), std::chrono::seconds(60), GetParam());
  }
  Communicator& c = pieces ? *pieces : *g_comm;
  for (const std::vector<std::size_t>& counts :
       {std::vector<std::size_t>{1000, 37}, std::vector<std::size_t>{0, 1029}, std::vector<std::size_t>{16, 0}}) {
    ASSERT_EQ(counts.size(), static_cast<std::size_t>(n));
    std::size_t total = 0, at = 0;
    for (std::size_t k : counts) total += k;
    for (int r = 0; r < me; ++r) at += counts[static_cast<std::size_t>(r)];
    std::vector<float> f(total);
    std::vector<double> d(total);
    for (std::size_t i = 0; i < total; ++i) f[i] = value(me, i), d[i] = 3.0 * value(me, i);
    c.reduce_scatter_sum(f.data(), counts);
    for (std::size_t i = at; i < at + counts[static_cast<std::size_t>(me)]; ++i) {
      float want = 0;
      for (int r = 0; r < n; ++r) want += value(r, i);
      ASSERT_EQ(f[i], want) << "reduce_scatter_sum, index " << i;  // two addends: exact in any order
    }
    // Every rank's block holds its rank-specific values; the gather puts all of them everywhere.
    for (std::size_t i = at; i < at + counts[static_cast<std::size_t>(me)]; ++i) f[i] = value(me, i), d[i] = -value(me, i);
    c.all_gather(f.data(), counts);
    c.all_gather(d.data(), counts);
    std::size_t from = 0;
    for (int r = 0; r < n; ++r) {
      for (std::size_t i = from; i < from + counts[static_cast<std::size_t>(r)]; ++i) {
        ASSERT_EQ(f[i], value(r, i)) << "all_gather (float), index " << i;
        ASSERT_EQ(d[i], -static_cast<double>(value(r, i))) << "all_gather (double), index " << i;
      }
      from += counts[static_cast<std::size_t>(r)];
    }
  }
  EXPECT_THROW(c.all_gather(static_cast<float*>(nullptr), std::vector<std::size_t>{1}), ght::logic_error);
}

INSTANTIATE_TEST_SUITE_P(Calls, DistCommMpiBlocks, testing::Values(std::size_t{0}, std::size_t{7}));

TEST(DistCommMpi, BroadcastFromEachRoot) {
  for (int root = 0; root < g_comm->size(); ++root) {
    std::string buf = g_comm->rank() == root ? "from root " + std::to_string(root) : std::string(11, '?');
    g_comm->broadcast(buf.data(), buf.size(), root);
    EXPECT_EQ(buf, "from root " + std::to_string(root));
  }
  g_comm->barrier();
}

// The GPU check of the NCCL set-up (trainer/dist/gpu_comm.hpp) over two real ranks, with made-up
// GPUs: every rank gathers every rank's identity, and two ranks on one GPU fail on both.
TEST(DistCommMpi, GpuIdentitiesGatherAndTwoRanksOnOneGpuFailOnEveryRank) {
  const int me = g_comm->rank();
  GpuIdentity mine;
  mine.rank = me;
  mine.host = "node-a";
  mine.pci_bus_id = "0000:0" + std::to_string(me + 1) + ":00.0";
  mine.uuid = "GPU-" + std::to_string(me);
  mine.choice = {me, "local rank " + std::to_string(me) + " (OMPI_COMM_WORLD_LOCAL_RANK)", "0,1"};
  const std::vector<GpuIdentity> all = gather_gpu_identities(*g_comm, mine);
  ASSERT_EQ(all.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(all[static_cast<std::size_t>(r)].rank, r);
    EXPECT_EQ(all[static_cast<std::size_t>(r)].uuid, "GPU-" + std::to_string(r));
    EXPECT_EQ(all[static_cast<std::size_t>(r)].choice.device, r);
  }
  EXPECT_NO_THROW(check_distinct_gpus(all));
  // GHT_DEVICE=0 exported to both ranks: the same GPU.
  mine.pci_bus_id = "0000:01:00.0";
  mine.uuid = "GPU-0";
  mine.choice = {0, "GHT_DEVICE=0", ""};
  const std::vector<GpuIdentity> same = gather_gpu_identities(*g_comm, mine);
  try {
    check_distinct_gpus(same);
    ADD_FAILURE() << "two ranks on one GPU passed on rank " << me;
  } catch (const ght::config_error& e) {
    EXPECT_NE(std::string(e.what()).find("ranks 0 and 1 both use the GPU at PCI 0000:01:00.0 (GPU-0) on host node-a"),
              std::string::npos)
        << e.what();
  }
}

// Last: it leaves rank 0's communicator failed. Rank 1 skips the barrier; rank 0 must time out
// and name the operation and rank 1. Then rank 1 joins, so rank 0's pending barrier completes
// and both ranks can finalize.
TEST(DistCommMpi, TimeoutNamesTheOperationAndTheRank) {
  int token = 0;
  if (g_comm->rank() == 0) {
    const Launch l = detect_launch(process_env());
    auto short_comm = make_communicator(l, std::chrono::duration<double>(1.0));
    std::string msg;
    try {
      short_comm->barrier();
    } catch (const timeout_error& e) {
      msg = e.what();
    }
    EXPECT_NE(msg.find("barrier (collective #1, on rank 0 of 2) timed out after 1 s"), std::string::npos) << msg;
    EXPECT_NE(msg.find("waited for rank 1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("GHT_DIST_TIMEOUT"), std::string::npos) << msg;
    MPI_Send(&token, 1, MPI_INT, 1, 0, MPI_COMM_WORLD);
  } else {
    MPI_Recv(&token, 1, MPI_INT, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    // Matches rank 0's timed-out barrier (a nonblocking collective matches only nonblocking ones).
    MPI_Request req = MPI_REQUEST_NULL;
    MPI_Ibarrier(MPI_COMM_WORLD, &req);
    MPI_Wait(&req, MPI_STATUS_IGNORE);
  }
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  g_comm = make_communicator(detect_launch(process_env()));
  const int rc = RUN_ALL_TESTS();
  // Rank 0's timed-out barrier was matched by rank 1's; this one progresses it to completion.
  MPI_Barrier(MPI_COMM_WORLD);
  int flag = rc, any = 0;
  MPI_Allreduce(&flag, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  g_comm.reset();  // MPI_Finalize
  return any;
}
