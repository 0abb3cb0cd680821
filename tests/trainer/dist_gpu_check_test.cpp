// trainer/dist/gpu_comm.*: the launch checks of the CUDA backend's data parallel, which need
// neither a GPU nor NCCL (the device choice, two ranks on one GPU, a build without NCCL), and the
// micro-batch share of each rank (trainer/data.hpp: for_each_rank_batch). The NCCL communicator
// itself runs in dist_gpu_comm_test.cu (one rank) and tests/cli/train_nccl_test.sh (two).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/temp_dir.hpp"
#include "tier/error.hpp"
#include "trainer/data.hpp"
#include "trainer/dist/comm.hpp"
#include "trainer/dist/gpu_comm.hpp"

namespace {

using namespace ght::dist;

// The message of the config_error `f` throws (a failure when it throws nothing).
template <class F>
std::string config_error_of(F&& f) {
  try {
    f();
  } catch (const ght::config_error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no ght::config_error";
  return "";
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

Launch launch(Launcher who, int rank, int world, int local) {
  Launch l;
  l.launcher = who;
  l.rank = rank;
  l.world_size = world;
  l.local_rank = local;
  if (who == Launcher::torchrun) {
    l.master_addr = "localhost";
    l.master_port = 29500;
  }
  return l;
}

// ---- check_gpu_launch ----------------------------------------------------------------------------

TEST(GpuLaunch, OneProcessNeedsNeitherNcclNorMpi) {
  EXPECT_NO_THROW(check_gpu_launch(Launch{}, false, false));
  EXPECT_NO_THROW(check_gpu_launch(launch(Launcher::torchrun, 0, 1, 0), false, false));
}

TEST(GpuLaunch, SeveralWithoutNcclAreRefused) {
  const std::string m = config_error_of([] { check_gpu_launch(launch(Launcher::open_mpi, 1, 2, 1), false, true); });
  EXPECT_TRUE(has(m, "this build has no NCCL")) << m;
  EXPECT_TRUE(has(m, "CUDA backend runs as one process")) << m;
  EXPECT_TRUE(has(m, "GHT_NCCL_DIR")) << m;
  EXPECT_TRUE(has(m, "rank 1 of 2")) << m;  // the launch is named
}

// torchrun-style: NCCL is set up through the TCP store, so MPI is not needed; NCCL is.
TEST(GpuLaunch, TorchrunOfSeveralNeedsNcclButNotMpi) {
  EXPECT_NO_THROW(check_gpu_launch(launch(Launcher::torchrun, 0, 2, 0), true, false));
  EXPECT_NO_THROW(check_gpu_launch(launch(Launcher::torchrun, 1, 2, 1), true, true));
  const std::string m = config_error_of([] { check_gpu_launch(launch(Launcher::torchrun, 0, 2, 0), false, true); });
  EXPECT_TRUE(has(m, "this build has no NCCL")) << m;
  EXPECT_TRUE(has(m, "launched by torchrun")) << m;  // the launch is named
}

// Without NCCL the torchrun-style host communicator of the CUDA backend is refused by name; a
// world of one needs nothing.
TEST(GpuLaunch, TorchrunHostCommunicatorWithoutNccl) {
  EXPECT_EQ(make_cuda_host_communicator(launch(Launcher::torchrun, 0, 1, 0))->name(), "single");
  if (have_nccl()) GTEST_SKIP() << "this build has NCCL (trainer_dist_staged_comm_test runs it on a GPU)";
  const std::string m = config_error_of([] { (void)make_cuda_host_communicator(launch(Launcher::torchrun, 0, 2, 0)); });
  EXPECT_TRUE(has(m, "torchrun-style launch of 2 processes")) << m;
  EXPECT_TRUE(has(m, "this build has no NCCL")) << m;
}

TEST(GpuLaunch, SeveralWithoutMpiAreRefused) {
  const std::string m = config_error_of([] { check_gpu_launch(launch(Launcher::slurm, 0, 4, 0), true, false); });
  EXPECT_TRUE(has(m, "no MPI")) << m;
}

TEST(GpuLaunch, SeveralWithNcclAndMpiPass) {
  EXPECT_NO_THROW(check_gpu_launch(launch(Launcher::open_mpi, 1, 2, 1), true, true));
  EXPECT_NO_THROW(check_gpu_launch(launch(Launcher::slurm, 3, 8, 3), true, true));
}

TEST(GpuLaunch, WithoutNcclTheGpuCommunicatorIsRefused) {
  if (have_nccl()) GTEST_SKIP() << "this build has NCCL (dist_gpu_comm_test runs the communicator on a GPU)";
  const auto cpu = make_single_communicator();
  const std::string m = config_error_of([&] { (void)make_gpu_communicator(*cpu, GpuChoice{}); });
  EXPECT_TRUE(has(m, "this build has no NCCL")) << m;
}

// ---- choose_gpu ----------------------------------------------------------------------------------

TEST(ChooseGpu, LocalRankPicksTheDevice) {
  const Env env{{"CUDA_VISIBLE_DEVICES", "0,1,2,3"}};
  const GpuChoice c = choose_gpu(launch(Launcher::open_mpi, 5, 8, 1), std::nullopt, 4, env);
  EXPECT_EQ(c.device, 1);
  EXPECT_EQ(c.visible_devices, "0,1,2,3");
  EXPECT_TRUE(has(c.chosen_by, "OMPI_COMM_WORLD_LOCAL_RANK=1")) << c.chosen_by;
  EXPECT_TRUE(has(choose_gpu(launch(Launcher::torchrun, 1, 2, 1), std::nullopt, 2, {}).chosen_by, "LOCAL_RANK=1"));
  EXPECT_TRUE(has(choose_gpu(launch(Launcher::slurm, 1, 2, 1), std::nullopt, 2, {}).chosen_by, "SLURM_LOCALID=1"));
}

TEST(ChooseGpu, ExplicitDeviceWins) {
  const GpuChoice c = choose_gpu(launch(Launcher::open_mpi, 1, 2, 1), 0, 1, {{"CUDA_VISIBLE_DEVICES", "3"}});
  EXPECT_EQ(c.device, 0);
  EXPECT_EQ(c.chosen_by, "GHT_DEVICE=0");
  EXPECT_EQ(choose_gpu(Launch{}, 2, 4, {}).device, 2);
  EXPECT_EQ(choose_gpu(Launch{}, std::nullopt, 1, {}).device, 0);  // one process: device 0
}

TEST(ChooseGpu, MoreRanksOnANodeThanGpusIsRefused) {
  const Env env{{"CUDA_VISIBLE_DEVICES", "0,1"}};
  const std::string m =
      config_error_of([&] { (void)choose_gpu(launch(Launcher::open_mpi, 2, 3, 2), std::nullopt, 2, env); });
  EXPECT_TRUE(has(m, "OMPI_COMM_WORLD_LOCAL_RANK=2")) << m;
  EXPECT_TRUE(has(m, "only 2 CUDA device(s)")) << m;
  EXPECT_TRUE(has(m, "CUDA_VISIBLE_DEVICES=0,1")) << m;
  EXPECT_TRUE(has(m, "world size 3")) << m;
  EXPECT_TRUE(has(m, "at most 2 per node")) << m;
}

TEST(ChooseGpu, ExplicitDeviceBeyondTheVisibleIsRefused) {
  const std::string m = config_error_of([] { (void)choose_gpu(launch(Launcher::open_mpi, 0, 2, 0), 3, 2, {}); });
  EXPECT_TRUE(has(m, "GHT_DEVICE=3")) << m;
  EXPECT_TRUE(has(m, "CUDA_VISIBLE_DEVICES unset")) << m;
}

TEST(ChooseGpu, NoVisibleDeviceIsRefused) {
  const std::string m =
      config_error_of([] { (void)choose_gpu(Launch{}, std::nullopt, 0, {{"CUDA_VISIBLE_DEVICES", ""}}); });
  EXPECT_TRUE(has(m, "no CUDA device is visible")) << m;
  EXPECT_TRUE(has(m, "CUDA_VISIBLE_DEVICES=")) << m;
}

// ---- GPU identities and duplicates -----------------------------------------------------------------

GpuIdentity ident(int rank, std::string host, std::string bus, std::string uuid, GpuChoice c) {
  GpuIdentity g;
  g.rank = rank;
  g.host = std::move(host);
  g.pci_bus_id = std::move(bus);
  g.uuid = std::move(uuid);
  g.choice = std::move(c);
  return g;
}

TEST(GpuIdentity, RecordRoundTrips) {
  const GpuIdentity g =
      ident(3, "node-7", "0000:3B:00.0", "GPU-0a1b2c3d-0000-1111-2222-333344445555", {2, "GHT_DEVICE=2", "4,5,6"});
  const std::string rec = serialize(g);
  EXPECT_LT(rec.size(), kGpuIdentityBytes);
  std::string padded = rec;
  padded.resize(kGpuIdentityBytes, '\0');  // as it travels
  const GpuIdentity h = parse_gpu_identity(padded);
  EXPECT_EQ(h.rank, 3);
  EXPECT_EQ(h.host, "node-7");
  EXPECT_EQ(h.pci_bus_id, "0000:3B:00.0");
  EXPECT_EQ(h.uuid, g.uuid);
  EXPECT_EQ(h.choice.device, 2);
  EXPECT_EQ(h.choice.chosen_by, "GHT_DEVICE=2");
  EXPECT_EQ(h.choice.visible_devices, "4,5,6");
}

TEST(GpuIdentity, NewlinesInFieldsDoNotShiftTheRecord) {
  const GpuIdentity h = parse_gpu_identity(serialize(ident(1, "a\nb", "bus", "", {0, "x", "0,\n1"})));
  EXPECT_EQ(h.host, "a b");
  EXPECT_EQ(h.choice.visible_devices, "0, 1");
  EXPECT_EQ(h.choice.device, 0);
}

TEST(GpuIdentity, MalformedRecordIsRefused) {
  EXPECT_THROW((void)parse_gpu_identity("hello"), ght::logic_error);
  EXPECT_THROW((void)parse_gpu_identity(""), ght::logic_error);
  std::string rec = serialize(ident(1, "h", "b", "u", {0, "x", ""}));
  rec.replace(rec.find("\n1\n"), 3, "\nx\n");  // the rank is not a number
  EXPECT_THROW((void)parse_gpu_identity(rec), ght::logic_error);
}

TEST(GpuIdentity, GatherOverOneProcessIsItsOwn) {
  const auto cpu = make_single_communicator();
  const auto all = gather_gpu_identities(*cpu, ident(0, "h", "0000:01:00.0", "GPU-1", {0, "c", ""}));
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].pci_bus_id, "0000:01:00.0");
  EXPECT_EQ(all[0].uuid, "GPU-1");
}

TEST(DistinctGpus, OneGpuPerRankPasses) {
  EXPECT_NO_THROW(check_distinct_gpus({ident(0, "n1", "0000:01:00.0", "GPU-a", {0, "local rank 0", ""}),
                                       ident(1, "n1", "0000:02:00.0", "GPU-b", {1, "local rank 1", ""})}));
  // The same bus id on two hosts is two GPUs (no UUIDs known).
  EXPECT_NO_THROW(check_distinct_gpus({ident(0, "n1", "0000:01:00.0", "", {0, "c", ""}),
                                       ident(1, "n2", "0000:01:00.0", "", {0, "c", ""})}));
  EXPECT_NO_THROW(check_distinct_gpus({}));
}

TEST(DistinctGpus, TwoRanksOnOneGpuAreRefusedNamingTheVariables) {
  const std::string m = config_error_of([] {
    check_distinct_gpus({ident(0, "n1", "0000:01:00.0", "GPU-a", {0, "GHT_DEVICE=0", "0,1"}),
                         ident(1, "n1", "0000:02:00.0", "GPU-b", {1, "GHT_DEVICE=1", "0,1"}),
                         ident(2, "n1", "0000:01:00.0", "GPU-a", {0, "GHT_DEVICE=0", "0,1"})});
  });
  EXPECT_TRUE(has(m, "ranks 0 and 2 both use the GPU at PCI 0000:01:00.0 (GPU-a) on host n1")) << m;
  for (const char* v : {"GHT_DEVICE", "LOCAL_RANK", "CUDA_VISIBLE_DEVICES=0,1"}) EXPECT_TRUE(has(m, v)) << v << ": " << m;
}

TEST(DistinctGpus, WithoutUuidsTheHostAndBusDecide) {
  const std::string m = config_error_of([] {
    check_distinct_gpus({ident(0, "n1", "0000:01:00.0", "", {0, "local rank 0 (LOCAL_RANK=0)", ""}),
                         ident(1, "n1", "0000:01:00.0", "", {0, "local rank 0 (LOCAL_RANK=0)", ""})});
  });
  EXPECT_TRUE(has(m, "ranks 0 and 1")) << m;
  EXPECT_TRUE(has(m, "CUDA_VISIBLE_DEVICES unset")) << m;
}

// ---- each rank's micro-batches ------------------------------------------------------------------------

TEST(RankBatches, RanksSplitTheStepsBatchesByPositionAndLoadersStayInStep) {
  ght::test::TempDir d("ght_rank_batches");
  std::vector<std::uint32_t> tok(4000);
  for (std::size_t i = 0; i < tok.size(); ++i) tok[i] = static_cast<std::uint32_t>((i * 7919) % 251);
  ght::trainer::write_shard(d / "s.bin", tok, ght::trainer::TokenDtype::u16);
  ght::trainer::LoaderOptions o;
  o.batch = 2;
  o.seq_len = 8;
  // One rank reading all N·A = 6 batches, in order.
  ght::trainer::DataLoader whole(std::vector<std::string>{d / "s.bin"}, o);
  std::vector<std::vector<std::int32_t>> all;
  for (int i = 0; i < 6; ++i) all.push_back(whole.next().inputs);
  const int N = 3, A = 2;
  for (int rank = 0; rank < N; ++rank) {
    ght::trainer::DataLoader mine(std::vector<std::string>{d / "s.bin"}, o);
    ght::trainer::Batch b;
    std::vector<int> seen;
    ght::trainer::for_each_rank_batch(mine, A, rank, N, b, [&](int i, const ght::trainer::Batch& mb) {
      EXPECT_EQ(i, static_cast<int>(seen.size()));
      const int pos = rank + N * i;
      EXPECT_EQ(mb.inputs, all[static_cast<std::size_t>(pos)]) << "rank " << rank << " batch " << i;
      seen.push_back(pos);
    });
    EXPECT_EQ(seen.size(), static_cast<std::size_t>(A));
    EXPECT_EQ(mine.state(), whole.state()) << "rank " << rank << "'s loader is not where one rank's is";
  }
  ght::trainer::Batch b;
  EXPECT_THROW(ght::trainer::for_each_rank_batch(whole, 1, 3, 3, b, [](int, const ght::trainer::Batch&) {}),
               ght::logic_error);
}

}  // namespace
