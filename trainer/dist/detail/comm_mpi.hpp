#pragma once
// The MPI communicator (trainer/dist/mpi/comm_mpi.cpp), built only with GHT_HAVE_MPI.
#include <chrono>
#include <cstddef>
#include <memory>

#include "trainer/dist/comm.hpp"

namespace ght::dist::detail {
#ifdef GHT_HAVE_MPI
/// Initialises MPI (once per process); MPI_Finalize runs when the communicator that initialised
/// it goes, unless a collective failed or an exception is unwinding. `max_elems_per_call`: the most elements one
/// MPI call moves (MPI-3 counts are int); larger collectives go in pieces (tests make it small).
inline constexpr std::size_t kMpiMaxElemsPerCall = std::size_t{1} << 30;
std::unique_ptr<Communicator> make_mpi_communicator(const Launch& l, std::chrono::duration<double> timeout,
                                                    std::size_t max_elems_per_call = kMpiMaxElemsPerCall);
#endif
}  // namespace ght::dist::detail
