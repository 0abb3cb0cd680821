#pragma once
// The NCCL communicator (trainer/dist/nccl/gpu_comm_nccl.cpp), built only with GHT_HAVE_NCCL.
#include <chrono>
#include <memory>

#include "trainer/dist/gpu_comm.hpp"

namespace ght::dist::detail {
#ifdef GHT_HAVE_NCCL
/// make_gpu_communicator's NCCL half: `timeout` is resolved already.
std::unique_ptr<GpuCommunicator> make_nccl_communicator(Communicator& cpu, const GpuChoice& choice,
                                                        std::chrono::duration<double> timeout);
#endif
}  // namespace ght::dist::detail
