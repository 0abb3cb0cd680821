#include "alloc/logging.hpp"

#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstring>

#include "tier/error.hpp"

namespace ght::alloc {

namespace {
int thread_number() noexcept {
  static std::atomic<int> next{1};
  thread_local const int id = next.fetch_add(1, std::memory_order_relaxed);
  return id;
}
}  // namespace

log_sink::log_sink(const std::string& path) : path_(path), start_(std::chrono::steady_clock::now()) {
  file_ = std::fopen(path.c_str(), "w");
  if (file_ == nullptr) {
    throw ght::io_error("cannot create allocation log '" + path + "': " + std::strerror(errno));
  }
  if (std::fprintf(file_, "%s\n", kHeader) < 0) {
    std::fclose(file_);
    throw ght::io_error("cannot write allocation log '" + path + "': " + std::strerror(errno));
  }
}

log_sink::~log_sink() {
  if (file_ != nullptr) std::fclose(file_);
}

void log_sink::record(bool allocate, const void* p, std::size_t bytes, TierKind tier,
                      TensorClass cls, stream_t stream) noexcept {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now() - start_)
                      .count();
  const int thread = thread_number();
  std::lock_guard lock(mu_);
  // The time is taken before the lock, so lines from different threads can be a few
  // nanoseconds out of time order; the file order is the order that matters for replay.
  const int n = std::fprintf(file_, "%d,%lld,%s,0x%" PRIxPTR ",%zu,%s,%s,0x%" PRIxPTR "\n", thread,
                             static_cast<long long>(ns), allocate ? "allocate" : "free",
                             reinterpret_cast<std::uintptr_t>(p), bytes,
                             std::string(to_string(tier)).c_str(),
                             std::string(to_string(cls)).c_str(),
                             reinterpret_cast<std::uintptr_t>(stream));
  if (n < 0) failed_ = true;
}

void log_sink::flush() {
  std::lock_guard lock(mu_);
  if (std::fflush(file_) != 0) failed_ = true;
  if (failed_) throw ght::io_error("writing allocation log '" + path_ + "' failed");
}

logging_adaptor::logging_adaptor(memory_resource& upstream, std::shared_ptr<log_sink> sink)
    : adaptor_base(upstream),
      name_("logging(" + std::string(upstream.name()) + ")"),
      sink_(std::move(sink)) {
  GHT_EXPECTS(sink_ != nullptr, "logging_adaptor: the log sink is null");
}

logging_adaptor::logging_adaptor(std::unique_ptr<memory_resource> upstream,
                                 std::shared_ptr<log_sink> sink)
    : adaptor_base(std::move(upstream)),
      name_("logging(" + std::string(this->upstream().name()) + ")"),
      sink_(std::move(sink)) {
  GHT_EXPECTS(sink_ != nullptr, "logging_adaptor: the log sink is null");
}

void* logging_adaptor::do_allocate(std::size_t bytes, std::size_t alignment, stream_t stream,
                                   TensorClass cls) {
  void* p = upstream().allocate(bytes, alignment, stream, cls);
  sink_->record(true, p, bytes, upstream().tier_of(p), cls, stream);
  return p;
}

void logging_adaptor::do_deallocate(void* p, std::size_t bytes, std::size_t alignment,
                                    stream_t stream, TensorClass cls) {
  sink_->record(false, p, bytes, upstream().tier_of(p), cls, stream);
  upstream().deallocate(p, bytes, alignment, stream, cls);
}

}  // namespace ght::alloc
