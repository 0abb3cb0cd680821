#pragma once
/**
 * @file logging.hpp
 * @brief logging_adaptor: a replayable CSV of every allocation and free.
 *
 * Columns: thread,time_ns,action,pointer,size,tier,class,stream
 *   thread   small integer id of the calling thread (1, 2, ... in order of first use)
 *   time_ns  nanoseconds since the sink was opened (steady clock)
 *   action   allocate | free
 *   pointer  block address, hex (0x...)
 *   size     bytes as requested
 *   tier     hbm | host
 *   class    weight | grad | master | adam_m | adam_v | activation | other
 *   stream   CUDA stream, hex (0x0 = default stream)
 * A free is written before the block is returned upstream and an allocation after it is
 * obtained, so the file never shows an address allocated twice without a free between.
 * `ght alloc-replay FILE` (alloc/replay.hpp) replays it.
 */
#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>

#include "alloc/adaptor.hpp"

namespace ght::alloc {

/// One CSV file shared by any number of logging adaptors; lines are written whole under a lock.
class log_sink {
 public:
  static constexpr const char* kHeader = "thread,time_ns,action,pointer,size,tier,class,stream";
  /// Create (truncate) `path` and write the header. @throws ght::io_error naming the path
  explicit log_sink(const std::string& path);
  ~log_sink();
  log_sink(const log_sink&) = delete;
  log_sink& operator=(const log_sink&) = delete;

  void record(bool allocate, const void* p, std::size_t bytes, TierKind tier, TensorClass cls,
              stream_t stream) noexcept;
  /// Push buffered lines to the file. @throws ght::io_error if writing failed
  void flush();
  [[nodiscard]] const std::string& path() const noexcept { return path_; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  std::mutex mu_;
  bool failed_ = false;
  std::chrono::steady_clock::time_point start_;
};

class logging_adaptor final : public adaptor_base {
 public:
  logging_adaptor(memory_resource& upstream, std::shared_ptr<log_sink> sink);
  logging_adaptor(std::unique_ptr<memory_resource> upstream, std::shared_ptr<log_sink> sink);

  [[nodiscard]] log_sink& sink() const noexcept { return *sink_; }
  [[nodiscard]] std::string_view name() const noexcept override { return name_; }

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, stream_t stream,
                    TensorClass cls) override;
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment, stream_t stream,
                     TensorClass cls) override;

  std::string name_;
  std::shared_ptr<log_sink> sink_;
};

}  // namespace ght::alloc
