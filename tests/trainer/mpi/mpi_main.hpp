#pragma once
// main() of a GoogleTest executable that runs under mpirun (tests/CMakeLists.txt): one
// communicator per process (MPI is initialised once, in `comm`), every rank runs every test, and
// a failure on any rank fails the job on every rank.
#include <gtest/gtest.h>
#include <mpi.h>

#include <memory>

#include "trainer/dist/comm.hpp"
#include "trainer/dist/launch.hpp"

namespace ght::test {

inline int run_mpi_tests(int argc, char** argv, std::shared_ptr<dist::Communicator>& comm) {
  ::testing::InitGoogleTest(&argc, argv);
  comm = dist::make_communicator(dist::detect_launch(dist::process_env()));
  const int rc = RUN_ALL_TESTS();
  int flag = rc, any = 0;
  MPI_Allreduce(&flag, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  comm.reset();  // MPI_Finalize
  return any;
}

}  // namespace ght::test
