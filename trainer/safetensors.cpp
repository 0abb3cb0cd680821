#include "trainer/safetensors.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "tier/error.hpp"
#include "trainer/file_io.hpp"

namespace fs = std::filesystem;

namespace ght::trainer {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian and is read in place");

namespace {

// The reference implementation refuses headers above 100 MB; so do we, before allocating.
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;

[[noreturn]] void st_fail(const std::string& path, const std::string& what) {
  throw io_error(path + ": " + what);
}

std::string shape_str(const std::vector<std::int64_t>& s) {
  std::string r = "[";
  for (std::size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

std::int64_t numel_of(const std::vector<std::int64_t>& shape) noexcept {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

}  // namespace

std::size_t dtype_size(StDtype d) noexcept {
  switch (d) {
    case StDtype::F64: case StDtype::I64: return 8;
    case StDtype::F32: case StDtype::I32: return 4;
    case StDtype::BF16: case StDtype::F16: case StDtype::I16: return 2;
    case StDtype::I8: case StDtype::U8: case StDtype::BOOL: return 1;
  }
  return 0;
}

std::string_view to_string(StDtype d) noexcept {
  switch (d) {
    case StDtype::F32: return "F32";
    case StDtype::BF16: return "BF16";
    case StDtype::F16: return "F16";
    case StDtype::I32: return "I32";
    case StDtype::F64: return "F64";
    case StDtype::I64: return "I64";
    case StDtype::I16: return "I16";
    case StDtype::I8: return "I8";
    case StDtype::U8: return "U8";
    case StDtype::BOOL: return "BOOL";
  }
  return "?";
}

std::optional<StDtype> parse_st_dtype(std::string_view s) noexcept {
  for (auto d : {StDtype::F32, StDtype::BF16, StDtype::F16, StDtype::I32, StDtype::F64,
                 StDtype::I64, StDtype::I16, StDtype::I8, StDtype::U8, StDtype::BOOL}) {
    if (s == to_string(d)) return d;
  }
  return std::nullopt;
}

std::int64_t TensorRef::numel() const noexcept { return numel_of(shape); }
std::int64_t TensorInfo::numel() const noexcept { return numel_of(shape); }

// ---- writing ------------------------------------------------------------------------------------

namespace {

// The header; `with_data`: every non-empty tensor must point at its bytes.
std::string make_header(std::span<const TensorRef> tensors, const StMetadata& metadata, bool with_data) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    h["__metadata__"] = m;
  }
  std::set<std::string_view> seen;
  std::uint64_t off = 0;
  for (const auto& t : tensors) {
    GHT_EXPECTS(!t.name.empty() && t.name != "__metadata__",
                "safetensors: invalid tensor name '" + t.name + "'");
    GHT_EXPECTS(seen.insert(t.name).second, "safetensors: duplicate tensor name '" + t.name + "'");
    for (auto d : t.shape) {
      GHT_EXPECTS(d >= 0, "safetensors: tensor '" + t.name + "' has a negative dimension in " +
                              shape_str(t.shape));
    }
    GHT_EXPECTS(!with_data || t.data != nullptr || t.bytes() == 0, "safetensors: tensor '" + t.name + "' has no data");
    const std::uint64_t end = off + t.bytes();
    h[t.name] = {{"dtype", std::string(to_string(t.dtype))}, {"shape", t.shape}, {"data_offsets", {off, end}}};
    off = end;
  }
  std::string json = h.dump();
  // Pad with spaces so the data buffer starts at a multiple of 8 bytes.
  json.append((8 - (8 + json.size()) % 8) % 8, ' ');
  std::string out(8, '\0');
  const std::uint64_t n = json.size();
  std::memcpy(out.data(), &n, 8);
  return out + json;
}

// Large tensors go in 64 MiB pieces so one write() never exceeds what Linux accepts at once.
void write_bytes(fileio::OutFile& out, const void* data, std::uint64_t bytes) {
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const std::uint64_t n = std::min<std::uint64_t>(bytes, 64ULL << 20);
    out.write(p, static_cast<std::size_t>(n));
    p += n;
    bytes -= n;
  }
}

}  // namespace

std::string safetensors_header(std::span<const TensorRef> tensors, const StMetadata& metadata) {
  return make_header(tensors, metadata, true);
}

void write_safetensors_streamed(fileio::OutFile& out, std::span<const TensorRef> tensors, const StMetadata& metadata,
                                const std::function<void(std::size_t, void*)>& fill) {
  const std::string header = make_header(tensors, metadata, false);
  out.write(header.data(), header.size());
  std::uint64_t largest = 0;
  for (const auto& t : tensors) largest = std::max(largest, t.bytes());
  std::vector<std::uint64_t> buf((largest + 7) / 8);  // 8-byte aligned for any dtype
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    fill(i, buf.data());
    write_bytes(out, buf.data(), tensors[i].bytes());
  }
}

void write_safetensors(fileio::OutFile& out, std::span<const TensorRef> tensors,
                       const StMetadata& metadata) {
  const std::string header = safetensors_header(tensors, metadata);
  out.write(header.data(), header.size());
  for (const auto& t : tensors) write_bytes(out, t.data, t.bytes());
}

void write_safetensors(const std::string& path, std::span<const TensorRef> tensors,
                       const StMetadata& metadata) {
  const std::string tmp = path + ".tmp";
  try {
    fileio::OutFile f(tmp);
    write_safetensors(f, tensors, metadata);
    f.close();
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    st_fail(path, std::string("cannot rename the temporary file into place: ") + std::strerror(errno));
  }
  fileio::fsync_dir(fs::path(path).parent_path().string());
}

std::vector<std::string> write_safetensors_sharded(const std::string& dir,
                                                   std::span<const TensorRef> tensors,
                                                   const ShardedWriteOptions& opt) {
  GHT_EXPECTS(opt.max_shard_bytes > 0, "safetensors: max_shard_bytes must be > 0");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) st_fail(dir, "cannot create directory: " + ec.message());
  // Greedy packing in the given order, as transformers' save_pretrained does.
  std::vector<std::vector<TensorRef>> shards(1);
  std::uint64_t cur = 0, total = 0;
  for (const auto& t : tensors) {
    if (!shards.back().empty() && cur + t.bytes() > opt.max_shard_bytes) {
      shards.emplace_back();
      cur = 0;
    }
    shards.back().push_back(t);
    cur += t.bytes();
    total += t.bytes();
  }
  std::vector<std::string> written;
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  if (shards.size() == 1) {
    write_safetensors((fs::path(dir) / "model.safetensors").string(), shards[0], opt.metadata);
    fs::remove(index_path, ec);  // a stale index would shadow the single file on load
    written.emplace_back("model.safetensors");
    return written;
  }
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  for (std::size_t i = 0; i < shards.size(); ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    write_safetensors((fs::path(dir) / name).string(), shards[i], opt.metadata);
    for (const auto& t : shards[i]) weight_map[t.name] = name;
    written.emplace_back(name);
  }
  nlohmann::ordered_json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  fileio::atomic_write(index_path.string(), index.dump(2) + "\n");
  fs::remove(fs::path(dir) / "model.safetensors", ec);
  written.emplace_back("model.safetensors.index.json");
  return written;
}

// ---- reading ------------------------------------------------------------------------------------

SafetensorsReader::SafetensorsReader(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) st_fail(path_, std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd_, &st) != 0) st_fail(path_, std::string("cannot stat: ") + std::strerror(errno));
  const auto file_size = static_cast<std::uint64_t>(st.st_size);
  std::uint64_t n = 0;
  if (file_size < 8 || ::pread(fd_, &n, 8, 0) != 8) {
    st_fail(path_, "truncated: a safetensors file starts with an 8-byte header length, file has " +
                       std::to_string(file_size) + " bytes");
  }
  if (n > kMaxHeaderBytes) st_fail(path_, "header length " + std::to_string(n) + " exceeds the 100 MB limit");
  if (8 + n > file_size) {
    st_fail(path_, "truncated: header length " + std::to_string(n) + " runs past the end of the " +
                       std::to_string(file_size) + "-byte file");
  }
  std::string json(n, '\0');
  if (n > 0 && ::pread(fd_, json.data(), n, 8) != static_cast<ssize_t>(n)) {
    st_fail(path_, std::string("cannot read header: ") + std::strerror(errno));
  }
  data_start_ = 8 + n;
  const std::uint64_t data_size = file_size - data_start_;

  nlohmann::json h;
  try {
    h = nlohmann::json::parse(json);
  } catch (const nlohmann::json::exception& e) {
    st_fail(path_, std::string("header is not valid JSON: ") + e.what());
  }
  if (!h.is_object()) st_fail(path_, "header is not a JSON object");
  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string& name = it.key();
    const auto& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) st_fail(path_, "__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) st_fail(path_, "__metadata__ value '" + m.key() + "' is not a string");
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = "tensor '" + name + "'";
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets")) {
      st_fail(path_, where + " lacks dtype, shape or data_offsets");
    }
    TensorInfo t;
    t.name = name;
    if (!v["dtype"].is_string()) st_fail(path_, where + ": dtype is not a string");
    const auto dt = parse_st_dtype(v["dtype"].get<std::string>());
    if (!dt) st_fail(path_, where + ": unsupported dtype " + v["dtype"].dump());
    t.dtype = *dt;
    if (!v["shape"].is_array()) st_fail(path_, where + ": shape is not an array");
    for (const auto& d : v["shape"]) {
      if (!d.is_number_unsigned()) st_fail(path_, where + ": shape " + v["shape"].dump() + " has a non-integer or negative dimension");
      t.shape.push_back(d.get<std::int64_t>());
    }
    const auto& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      st_fail(path_, where + ": data_offsets " + off.dump() + " is not [begin, end]");
    }
    t.begin = off[0].get<std::uint64_t>();
    t.end = off[1].get<std::uint64_t>();
    if (t.end < t.begin) st_fail(path_, where + ": data_offsets " + off.dump() + " end before begin");
    const std::uint64_t want = static_cast<std::uint64_t>(t.numel()) * dtype_size(t.dtype);
    if (t.end - t.begin != want) {
      st_fail(path_, where + ": " + std::to_string(t.end - t.begin) + " bytes in data_offsets, but " +
                         std::string(to_string(t.dtype)) + " " + shape_str(t.shape) + " needs " +
                         std::to_string(want));
    }
    if (t.end > data_size) {
      st_fail(path_, where + ": data_offsets " + off.dump() + " run past the " +
                         std::to_string(data_size) + "-byte data buffer (file truncated?)");
    }
    tensors_.push_back(std::move(t));
  }
  std::sort(tensors_.begin(), tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::uint64_t expect = 0;
  const TensorInfo* prev = nullptr;
  for (const auto& t : tensors_) {
    if (t.begin < expect) {
      st_fail(path_, "tensor '" + t.name + "' overlaps tensor '" + prev->name + "' (bytes " +
                         std::to_string(t.begin) + ".." + std::to_string(expect) + ")");
    }
    if (t.begin > expect) {
      st_fail(path_, "hole in the data buffer before tensor '" + t.name + "' (bytes " +
                         std::to_string(expect) + ".." + std::to_string(t.begin) + " belong to no tensor)");
    }
    expect = t.end;
    prev = &t;
  }
  if (expect != data_size) {
    st_fail(path_, std::to_string(data_size - expect) + " trailing bytes after the last tensor");
  }
  for (std::size_t i = 0; i < tensors_.size(); ++i) index_[tensors_[i].name] = i;
}

SafetensorsReader::~SafetensorsReader() {
  if (fd_ >= 0) ::close(fd_);
}

SafetensorsReader::SafetensorsReader(SafetensorsReader&& o) noexcept { *this = std::move(o); }

SafetensorsReader& SafetensorsReader::operator=(SafetensorsReader&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(o.path_);
    fd_ = std::exchange(o.fd_, -1);
    data_start_ = o.data_start_;
    tensors_ = std::move(o.tensors_);
    index_ = std::move(o.index_);
    metadata_ = std::move(o.metadata_);
  }
  return *this;
}

const TensorInfo* SafetensorsReader::find(std::string_view name) const noexcept {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const TensorInfo& SafetensorsReader::at(std::string_view name) const {
  const TensorInfo* t = find(name);
  if (t == nullptr) st_fail(path_, "no tensor named '" + std::string(name) + "'");
  return *t;
}

std::string SafetensorsReader::header_bytes() const {
  std::string h(data_start_, '\0');
  if (::pread(fd_, h.data(), h.size(), 0) != static_cast<ssize_t>(h.size())) {
    st_fail(path_, std::string("cannot re-read the header: ") + std::strerror(errno));
  }
  return h;
}

void SafetensorsReader::read_raw(const TensorInfo& t, void* dst) const {
  auto* p = static_cast<char*>(dst);
  std::uint64_t off = data_start_ + t.begin, left = t.end - t.begin;
  while (left > 0) {
    const ssize_t n = ::pread(fd_, p, static_cast<std::size_t>(std::min<std::uint64_t>(left, 1ULL << 30)),
                              static_cast<off_t>(off));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      st_fail(path_, "tensor '" + t.name + "': read failed" +
                         (n < 0 ? std::string(": ") + std::strerror(errno) : std::string(" (file shrank?)")));
    }
    p += n;
    off += static_cast<std::uint64_t>(n);
    left -= static_cast<std::uint64_t>(n);
  }
}

std::vector<float> SafetensorsReader::read_f32(std::string_view name) const {
  const TensorInfo& t = at(name);
  std::vector<float> out(static_cast<std::size_t>(t.numel()));
  if (t.dtype == StDtype::F32) {
    read_raw(t, out.data());
    return out;
  }
  if (t.dtype != StDtype::BF16 && t.dtype != StDtype::F16) {
    st_fail(path_, "tensor '" + t.name + "' has dtype " + std::string(to_string(t.dtype)) +
                       ", which cannot be read as floats (F32, BF16 or F16)");
  }
  std::vector<std::uint16_t> raw(out.size());
  read_raw(t, raw.data());
  for (std::size_t i = 0; i < raw.size(); ++i) {
    out[i] = t.dtype == StDtype::BF16 ? bf16_to_f32(raw[i]) : f16_to_f32(raw[i]);
  }
  return out;
}

std::vector<std::int32_t> SafetensorsReader::read_i32(std::string_view name) const {
  const TensorInfo& t = at(name);
  if (t.dtype != StDtype::I32) {
    st_fail(path_, "tensor '" + t.name + "' has dtype " + std::string(to_string(t.dtype)) + ", expected I32");
  }
  std::vector<std::int32_t> out(static_cast<std::size_t>(t.numel()));
  read_raw(t, out.data());
  return out;
}

SafetensorsDir::SafetensorsDir(const std::string& dir) : dir_(dir) {
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  std::error_code ec;
  if (fs::exists(index_path, ec)) {
    const std::string ip = index_path.string();
    nlohmann::json idx;
    try {
      idx = nlohmann::json::parse(fileio::read_all(ip));
    } catch (const nlohmann::json::exception& e) {
      st_fail(ip, std::string("not valid JSON: ") + e.what());
    }
    if (!idx.is_object() || !idx.contains("weight_map") || !idx["weight_map"].is_object()) {
      st_fail(ip, "lacks a \"weight_map\" object");
    }
    std::map<std::string, std::size_t> file_slot;
    for (auto it = idx["weight_map"].begin(); it != idx["weight_map"].end(); ++it) {
      if (!it.value().is_string()) st_fail(ip, "weight_map entry '" + it.key() + "' is not a file name");
      const std::string file = it.value().get<std::string>();
      if (file.find('/') != std::string::npos || file.find("..") != std::string::npos) {
        st_fail(ip, "weight_map entry '" + it.key() + "' names a file outside the directory: " + file);
      }
      auto slot = file_slot.find(file);
      if (slot == file_slot.end()) {
        const fs::path fp = fs::path(dir) / file;
        if (!fs::exists(fp, ec)) st_fail(ip, "shard " + file + " (holding '" + it.key() + "') does not exist");
        files_.emplace_back(fp.string());
        slot = file_slot.emplace(file, files_.size() - 1).first;
      }
      if (files_[slot->second].find(it.key()) == nullptr) {
        st_fail(ip, "weight_map places tensor '" + it.key() + "' in " + file + ", which does not hold it");
      }
      where_[it.key()] = slot->second;
    }
    return;
  }
  const fs::path single = fs::path(dir) / "model.safetensors";
  if (!fs::exists(single, ec)) {
    st_fail(dir, "holds neither model.safetensors nor model.safetensors.index.json");
  }
  files_.emplace_back(single.string());
  for (const auto& t : files_[0].tensors()) where_[t.name] = 0;
}

std::vector<std::string> SafetensorsDir::names() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : where_) out.push_back(k);
  return out;
}

bool SafetensorsDir::contains(std::string_view name) const { return where_.find(name) != where_.end(); }

const TensorInfo& SafetensorsDir::info(std::string_view name) const {
  const auto it = where_.find(name);
  if (it == where_.end()) st_fail(dir_, "no tensor named '" + std::string(name) + "'");
  return files_[it->second].at(name);
}

std::vector<float> SafetensorsDir::read_f32(std::string_view name) const {
  const auto it = where_.find(name);
  if (it == where_.end()) st_fail(dir_, "no tensor named '" + std::string(name) + "'");
  return files_[it->second].read_f32(name);
}

// ---- conversions ----------------------------------------------------------------------------

std::uint16_t f32_to_bf16(float f) noexcept {
  const auto x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((x >> 16) | 0x0040u);  // quiet NaN
  const std::uint32_t rounding = 0x7FFFu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>((x + rounding) >> 16);
}

float bf16_to_f32(std::uint16_t h) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16);
}

// Fabian Giesen's branch-light float -> half with round-to-nearest-even (public domain).
std::uint16_t f32_to_f16(float f) noexcept {
  constexpr std::uint32_t f32_inf = 255u << 23;
  constexpr std::uint32_t f16_max = (127u + 16u) << 23;  // 2^16: first value that overflows
  constexpr std::uint32_t denorm_magic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
  std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = x & 0x80000000u;
  x ^= sign;
  std::uint32_t o;
  if (x >= f16_max) {
    o = x > f32_inf ? 0x7E00u : 0x7C00u;
  } else if (x < (113u << 23)) {
    // Subnormal or zero: let the FPU round by adding a magic number that aligns the mantissa.
    const float sum = std::bit_cast<float>(x) + std::bit_cast<float>(denorm_magic);
    o = std::bit_cast<std::uint32_t>(sum) - denorm_magic;
  } else {
    const std::uint32_t mant_odd = (x >> 13) & 1u;
    x += ((15u - 127u) << 23) + 0xFFFu;  // rebias the exponent, round
    x += mant_odd;
    o = x >> 13;
  }
  return static_cast<std::uint16_t>(o | (sign >> 16));
}

float f16_to_f32(std::uint16_t h) noexcept {
  constexpr std::uint32_t shifted_exp = 0x7C00u << 13;
  std::uint32_t o = (static_cast<std::uint32_t>(h) & 0x7FFFu) << 13;
  const std::uint32_t exp = shifted_exp & o;
  o += (127u - 15u) << 23;
  if (exp == shifted_exp) {
    o += (128u - 16u) << 23;  // Inf/NaN
  } else if (exp == 0) {
    o += 1u << 23;  // subnormal: renormalise
    o = std::bit_cast<std::uint32_t>(std::bit_cast<float>(o) - std::bit_cast<float>(113u << 23));
  }
  return std::bit_cast<float>(o | ((static_cast<std::uint32_t>(h) & 0x8000u) << 16));
}

}  // namespace ght::trainer
