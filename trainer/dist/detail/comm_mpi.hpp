#pragma once
// The MPI communicator (trainer/dist/mpi/comm_mpi.cpp), built only with GHT_HAVE_MPI.
#include <chrono>
#include <memory>

#include "trainer/dist/comm.hpp"

namespace ght::dist::detail {
#ifdef GHT_HAVE_MPI
/// Initialises MPI (once per process); MPI_Finalize runs when the communicator goes, unless a
/// collective failed or an exception is unwinding.
std::unique_ptr<Communicator> make_mpi_communicator(const Launch& l, std::chrono::duration<double> timeout);
#endif
}  // namespace ght::dist::detail
