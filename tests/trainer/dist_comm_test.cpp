// trainer/dist/comm.*: the world-size-1 communicator and the factory's refusals. The MPI
// communicator is tested under mpirun by dist_comm_mpi_test.cpp.
#include <gtest/gtest.h>

#include <vector>

#include "tier/error.hpp"
#include "trainer/dist/comm.hpp"

namespace {

using namespace ght::dist;

TEST(DistComm, SingleIsRankZeroOfOne) {
  const auto c = make_single_communicator();
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->size(), 1);
  EXPECT_EQ(c->name(), "single");
}

TEST(DistComm, SingleCollectivesLeaveDataAlone) {
  const auto c = make_single_communicator();
  std::vector<float> f{1.5f, -2.25f, 3e-8f};
  std::vector<double> d{0.1, 1e300};
  c->allreduce_sum(f.data(), f.size());
  c->allreduce_sum(d.data(), d.size());
  EXPECT_EQ(f, (std::vector<float>{1.5f, -2.25f, 3e-8f}));
  EXPECT_EQ(d, (std::vector<double>{0.1, 1e300}));
  int x = 7;
  c->broadcast(&x, sizeof x, 0);
  EXPECT_EQ(x, 7);
  c->barrier();
}

TEST(DistComm, BroadcastRootMustBeARank) {
  const auto c = make_single_communicator();
  int x = 0;
  EXPECT_THROW(c->broadcast(&x, sizeof x, 1), ght::logic_error);
  EXPECT_THROW(c->broadcast(&x, sizeof x, -1), ght::logic_error);
}

TEST(DistComm, WorldOfOneNeedsNoTransport) {
  Launch l;
  l.launcher = Launcher::torchrun;  // even torchrun-style: one process needs no rendezvous
  EXPECT_EQ(make_communicator(l)->name(), "single");
}

TEST(DistComm, TorchrunOfSeveralIsRefusedOnTheCpu) {
  Launch l;
  l.launcher = Launcher::torchrun;
  l.world_size = 2;
  l.master_addr = "localhost";
  l.master_port = 29500;
  try {
    (void)make_communicator(l);
    FAIL() << "no error";
  } catch (const ght::config_error& e) {
    EXPECT_NE(std::string(e.what()).find("launch with mpirun -np 2 or srun"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("CPU backend"), std::string::npos) << e.what();
  }
}

TEST(DistComm, WithoutMpiSeveralProcessesAreRefused) {
  if (have_mpi()) GTEST_SKIP() << "this build has MPI (dist_comm_mpi_test runs it under mpirun)";
  Launch l;
  l.launcher = Launcher::open_mpi;
  l.world_size = 2;
  EXPECT_THROW((void)make_communicator(l), ght::config_error);
}

}  // namespace
