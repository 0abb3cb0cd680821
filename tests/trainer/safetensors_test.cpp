// safetensors: byte layout, round trips of every readable dtype, sharded export with an index,
// validation errors that name the file and tensor, and the 16-bit float conversions.
#include "trainer/safetensors.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "common/expect.hpp"
#include "common/temp_dir.hpp"
#include "tier/error.hpp"

namespace fs = std::filesystem;
using namespace ght::trainer;

namespace {

using ght::test::error_of;
using ght::test::read_bytes;
using ght::test::write_bytes;

// One directory per test, removed on scope exit.
struct TempDir : ght::test::TempDir {
  TempDir() : ght::test::TempDir("ght_st_test") {}
};

std::vector<float> randn(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// A safetensors file from a header JSON text and a data buffer, exactly as given.
std::string raw_file(const std::string& json, const std::string& data) {
  std::string out(8, '\0');
  const std::uint64_t n = json.size();
  std::memcpy(out.data(), &n, 8);
  return out + json + data;
}

}  // namespace

TEST(Safetensors, ByteLayoutOfASingleTensor) {
  TempDir d;
  const std::vector<float> v = {1.0f, -2.5f};
  const TensorRef t{"a", StDtype::F32, {2}, v.data()};
  write_safetensors(d / "one.safetensors", std::span(&t, 1));
  const std::string bytes = read_bytes(d / "one.safetensors");
  std::uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ((8 + n) % 8, 0u) << "data starts 8-byte aligned";
  const std::string json = bytes.substr(8, n);
  EXPECT_EQ(json.substr(0, json.find_last_not_of(' ') + 1),
            R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})");
  const std::string pad = json.substr(json.find_last_of('}') + 1);
  EXPECT_EQ(pad, std::string(pad.size(), ' ')) << "padding is spaces";
  EXPECT_LT(pad.size(), 8u);
  ASSERT_EQ(bytes.size(), 8 + n + 8);
  float back[2];
  std::memcpy(back, bytes.data() + 8 + n, 8);
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[1], -2.5f);
}

TEST(Safetensors, RoundTripOfEveryReadableDtypeWithMetadata) {
  TempDir d;
  const auto f32 = randn(6 * 5, 1);
  std::vector<std::uint16_t> bf16, f16;
  const auto src16 = randn(7, 2);
  for (float x : src16) {
    bf16.push_back(f32_to_bf16(x));
    f16.push_back(f32_to_f16(x));
  }
  const std::vector<std::int32_t> i32 = {-3, 0, 7, 1 << 30};
  const float scalar = 0.125f;
  const std::vector<TensorRef> ts = {
      {"model.layers.0.w", StDtype::F32, {6, 5}, f32.data()},
      {"b16", StDtype::BF16, {7}, bf16.data()},
      {"h16", StDtype::F16, {7, 1}, f16.data()},
      {"ids", StDtype::I32, {2, 2}, i32.data()},
      {"scalar", StDtype::F32, {}, &scalar},
      {"empty", StDtype::F32, {0, 4}, nullptr},
  };
  write_safetensors(d / "m.safetensors", ts, {{"format", "pt"}, {"note", "ghtier test"}});
  EXPECT_FALSE(fs::exists(d / "m.safetensors.tmp"));

  const SafetensorsReader r(d / "m.safetensors");
  EXPECT_EQ(r.metadata().at("format"), "pt");
  EXPECT_EQ(r.metadata().at("note"), "ghtier test");
  ASSERT_EQ(r.tensors().size(), ts.size());
  for (std::size_t i = 0; i < ts.size(); ++i) {
    // Tensors in the file come back in the order they were written (data-buffer order); the
    // zero-size tensor sits at the end with begin == end.
    const TensorInfo* info = r.find(ts[i].name);
    ASSERT_NE(info, nullptr) << ts[i].name;
    EXPECT_EQ(info->dtype, ts[i].dtype);
    EXPECT_EQ(info->shape, ts[i].shape);
    EXPECT_EQ(info->end - info->begin, ts[i].bytes());
  }
  EXPECT_EQ(r.read_f32("model.layers.0.w"), f32);
  const auto b = r.read_f32("b16");
  const auto h = r.read_f32("h16");
  for (std::size_t i = 0; i < src16.size(); ++i) {
    EXPECT_EQ(b[i], bf16_to_f32(bf16[i]));
    EXPECT_EQ(h[i], f16_to_f32(f16[i]));
    EXPECT_NEAR(b[i], src16[i], std::fabs(src16[i]) * 0x1p-8);
    EXPECT_NEAR(h[i], src16[i], std::fabs(src16[i]) * 0x1p-11);
  }
  EXPECT_EQ(r.read_i32("ids"), i32);
  EXPECT_EQ(r.read_f32("scalar"), std::vector<float>{0.125f});
  EXPECT_TRUE(r.read_f32("empty").empty());
  EXPECT_CONTAINS(error_of<ght::io_error>([&] { (void)r.read_f32("ids"); }), "'ids' has dtype I32");
  EXPECT_CONTAINS(error_of<ght::io_error>([&] { (void)r.read_f32("nope"); }), "no tensor named 'nope'");
}

TEST(Safetensors, ReadsAForeignHeaderOrderAndExtraDtypes) {
  TempDir d;
  // Keys in another order, tensors listed out of buffer order, an I64 tensor we only validate.
  const std::string json =
      R"({"z":{"data_offsets":[8,16],"shape":[1],"dtype":"I64"},"__metadata__":{"format":"pt"},)"
      R"("a":{"shape":[2],"dtype":"F32","data_offsets":[0,8]}})";
  std::string data(16, '\0');
  const float a[2] = {3.0f, 4.0f};
  std::memcpy(data.data(), a, 8);
  write_bytes(d / "f.safetensors", raw_file(json, data));
  const SafetensorsReader r(d / "f.safetensors");
  EXPECT_EQ(r.tensors().front().name, "a");
  EXPECT_EQ(r.read_f32("a"), (std::vector<float>{3.0f, 4.0f}));
  EXPECT_EQ(r.at("z").dtype, StDtype::I64);
}

TEST(SafetensorsErrors, EachNamesTheFileAndTensor) {
  TempDir d;
  const std::string p = d / "bad.safetensors";
  auto err = [&](const std::string& json, const std::string& data) {
    write_bytes(p, raw_file(json, data));
    return error_of<ght::io_error>([&] { SafetensorsReader r(p); });
  };
  const std::string d16(16, '\0');
  std::string m = err(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", d16.substr(0, 12));
  EXPECT_CONTAINS(m, p);
  EXPECT_CONTAINS(m, "tensor 'w'");
  EXPECT_CONTAINS(m, "run past");
  m = err(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", d16);
  EXPECT_CONTAINS(m, "tensor 'w'");
  EXPECT_CONTAINS(m, "needs 12");
  m = err(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
          d16.substr(0, 12));
  EXPECT_CONTAINS(m, "overlaps");
  m = err(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})", d16);
  EXPECT_CONTAINS(m, "hole");
  EXPECT_CONTAINS(m, "'b'");
  m = err(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", d16);
  EXPECT_CONTAINS(m, "8 trailing bytes");
  m = err(R"({"a":{"dtype":"F8_E9M9","shape":[2],"data_offsets":[0,2]}})", d16.substr(0, 2));
  EXPECT_CONTAINS(m, "unsupported dtype");
  m = err(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", d16.substr(0, 8));
  EXPECT_CONTAINS(m, "negative");
  m = err(R"({"a":{"dtype":"F32","shape":[2]}})", d16.substr(0, 8));
  EXPECT_CONTAINS(m, "lacks");
  m = err(R"({"a": nonsense)", "");
  EXPECT_CONTAINS(m, "not valid JSON");
  m = err(R"({"__metadata__":{"format":1}})", "");
  EXPECT_CONTAINS(m, "__metadata__");

  std::string huge(8, '\0');
  const std::uint64_t n = 1ULL << 40;
  std::memcpy(huge.data(), &n, 8);
  write_bytes(p, huge + "{}");
  EXPECT_CONTAINS(error_of<ght::io_error>([&] { SafetensorsReader r(p); }), "header length");
  write_bytes(p, "abc");
  EXPECT_CONTAINS(error_of<ght::io_error>([&] { SafetensorsReader r(p); }), "truncated");
}

TEST(SafetensorsErrors, WriterRejectsBadTensors) {
  TempDir d;
  const float x = 1;
  const std::vector<TensorRef> dup = {{"a", StDtype::F32, {1}, &x}, {"a", StDtype::F32, {1}, &x}};
  EXPECT_THROW(write_safetensors(d / "x.safetensors", dup), ght::logic_error);
  const std::vector<TensorRef> neg = {{"a", StDtype::F32, {-1}, &x}};
  EXPECT_THROW(write_safetensors(d / "x.safetensors", neg), ght::logic_error);
  EXPECT_FALSE(fs::exists(d / "x.safetensors"));
  EXPECT_FALSE(fs::exists(d / "x.safetensors.tmp"));
}

TEST(SafetensorsSharded, SplitsAboveTheThresholdAndReadsBack) {
  TempDir d;
  std::vector<std::vector<float>> data;
  std::vector<TensorRef> ts;
  const std::vector<std::size_t> sizes = {250, 250, 100, 600, 30};  // floats: 1000, 1000, 400, 2400, 120 bytes
  for (std::size_t i = 0; i < sizes.size(); ++i) data.push_back(randn(sizes[i], static_cast<std::uint32_t>(10 + i)));
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    ts.push_back({"model.t" + std::to_string(i), StDtype::F32, {static_cast<std::int64_t>(sizes[i])}, data[i].data()});
  }
  ShardedWriteOptions o;
  o.max_shard_bytes = 2000;
  const auto files = write_safetensors_sharded(d.path.string(), ts, o);
  // Greedy in order: [t0 t1] = 2000, [t2] (t3 would overflow), [t3] alone (larger than the
  // limit), [t4].
  ASSERT_EQ(files.size(), 5u);
  EXPECT_EQ(files[0], "model-00001-of-00004.safetensors");
  EXPECT_EQ(files[3], "model-00004-of-00004.safetensors");
  EXPECT_EQ(files[4], "model.safetensors.index.json");
  EXPECT_FALSE(fs::exists(d / "model.safetensors"));
  const auto idx = nlohmann::json::parse(read_bytes(d / "model.safetensors.index.json"));
  EXPECT_EQ(idx["metadata"]["total_size"], 4920);
  EXPECT_EQ(idx["weight_map"]["model.t0"], "model-00001-of-00004.safetensors");
  EXPECT_EQ(idx["weight_map"]["model.t1"], "model-00001-of-00004.safetensors");
  EXPECT_EQ(idx["weight_map"]["model.t2"], "model-00002-of-00004.safetensors");
  EXPECT_EQ(idx["weight_map"]["model.t3"], "model-00003-of-00004.safetensors");
  EXPECT_EQ(idx["weight_map"]["model.t4"], "model-00004-of-00004.safetensors");
  EXPECT_EQ(SafetensorsReader(d / "model-00002-of-00004.safetensors").metadata().at("format"), "pt");

  const SafetensorsDir dir(d.path.string());
  EXPECT_EQ(dir.files().size(), 4u);
  EXPECT_EQ(dir.names().size(), 5u);
  for (std::size_t i = 0; i < sizes.size(); ++i) EXPECT_EQ(dir.read_f32("model.t" + std::to_string(i)), data[i]);

  // Below the threshold: one file, and the stale index is gone.
  o.max_shard_bytes = 1'000'000;
  const auto single = write_safetensors_sharded(d.path.string(), ts, o);
  EXPECT_EQ(single, std::vector<std::string>{"model.safetensors"});
  EXPECT_FALSE(fs::exists(d / "model.safetensors.index.json"));
  const SafetensorsDir dir1(d.path.string());
  EXPECT_EQ(dir1.files().size(), 1u);
  EXPECT_EQ(dir1.read_f32("model.t3"), data[3]);
}

TEST(SafetensorsSharded, IndexErrorsNameTheIndexAndTensor) {
  TempDir d;
  const auto v = randn(4, 1);
  const std::vector<TensorRef> ts = {{"a", StDtype::F32, {4}, v.data()}};
  write_safetensors(d / "s1.safetensors", ts);
  write_bytes(d / "model.safetensors.index.json",
              R"({"metadata":{"total_size":16},"weight_map":{"a":"s1.safetensors","b":"s1.safetensors"}})");
  std::string m = error_of<ght::io_error>([&] { SafetensorsDir x(d.path.string()); });
  EXPECT_CONTAINS(m, "model.safetensors.index.json");
  EXPECT_CONTAINS(m, "'b'");
  write_bytes(d / "model.safetensors.index.json", R"({"weight_map":{"a":"missing.safetensors"}})");
  m = error_of<ght::io_error>([&] { SafetensorsDir x(d.path.string()); });
  EXPECT_CONTAINS(m, "missing.safetensors");
  fs::remove(d / "model.safetensors.index.json");
  m = error_of<ght::io_error>([&] { SafetensorsDir x(d.path.string()); });
  EXPECT_CONTAINS(m, "neither model.safetensors");
}

TEST(Float16, Bf16RoundsToNearestEven) {
  auto bits = [](std::uint32_t u) { return std::bit_cast<float>(u); };
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(f32_to_bf16(-2.0f), 0xC000);
  EXPECT_EQ(f32_to_bf16(bits(0x3F808000)), 0x3F80);  // tie, even stays
  EXPECT_EQ(f32_to_bf16(bits(0x3F818000)), 0x3F82);  // tie, odd rounds up
  EXPECT_EQ(f32_to_bf16(bits(0x3F808001)), 0x3F81);  // above the tie
  EXPECT_EQ(f32_to_bf16(bits(0x3F807FFF)), 0x3F80);  // below the tie
  EXPECT_EQ(f32_to_bf16(bits(0x7F7FFFFF)), 0x7F80);  // max float rounds to inf
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(bits(0x7F800001)))));  // signalling NaN stays NaN
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const float f = bf16_to_f32(static_cast<std::uint16_t>(h));
    if (!std::isnan(f)) {
      ASSERT_EQ(f32_to_bf16(f), h) << h;
    }
  }
}

TEST(Float16, F16RoundsToNearestEvenIncludingSubnormals) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3C00);
  EXPECT_EQ(f32_to_f16(-2.0f), 0xC000);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7BFF);
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7BFF);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00);  // halfway to the next binade rounds to inf
  EXPECT_EQ(f32_to_f16(0x1p-24f), 0x0001);  // smallest subnormal
  EXPECT_EQ(f32_to_f16(0x1p-25f), 0x0000);  // tie to even (zero)
  EXPECT_EQ(f32_to_f16(0x1.8p-24f), 0x0002);  // 1.5 ulp: tie to even (2)
  EXPECT_EQ(f32_to_f16(0x1p-14f), 0x0400);  // smallest normal
  EXPECT_EQ(f32_to_f16(1.0f + 0x1p-11f), 0x3C00);  // tie, even
  EXPECT_EQ(f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3C02);  // tie, odd rounds up
  EXPECT_EQ(f16_to_f32(0x0001), 0x1p-24f);
  EXPECT_EQ(f16_to_f32(0x8000), -0.0f);
  EXPECT_TRUE(std::signbit(f16_to_f32(0x8000)));
  EXPECT_TRUE(std::isinf(f16_to_f32(0x7C00)));
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(std::numeric_limits<float>::quiet_NaN()))));
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16_to_f32(static_cast<std::uint16_t>(h));
    if (!std::isnan(f)) {
      ASSERT_EQ(f32_to_f16(f), h) << h;
    }
  }
}
