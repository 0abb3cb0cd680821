// bench_optimizer in a build without CUDA: the host rows only.
#include "bench_common.hpp"

int main(int argc, char** argv) {
  return ght::bench::bench_main(argc, argv, "cpu-only", [](const ght::bench::Args&, ght::bench::Report& report) {
    report.notes.push_back("built without CUDA: gpu_link and device rows are not measured");
  });
}
