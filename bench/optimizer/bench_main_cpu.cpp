// bench_optimizer in a build without CUDA: the host rows only.
#include <exception>
#include <iostream>

#include "bench_common.hpp"

int main(int argc, char** argv) {
  using namespace ght::bench;
  Args args;
  int rc = 0;
  if (!parse_args(argc, argv, args, rc)) return rc;
  try {
    Report report;
    report.extra["build"] = "cpu-only";
    if (!args.skip_cpu) run_cpu(args, report);
    report.notes.push_back("built without CUDA: gpu_link and device rows are not measured");
    return finish(args, report);
  } catch (const std::exception& e) {
    std::cerr << "bench_optimizer: " << e.what() << "\n";
    return 1;
  }
}
