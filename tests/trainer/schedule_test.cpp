// Learning-rate schedules: values at the key points of each shape, and validation.
#include "trainer/schedule.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "tier/error.hpp"

using namespace ght::trainer;

namespace {
ScheduleConfig make(ScheduleKind k) {
  ScheduleConfig s;
  s.kind = k;
  s.lr = 1.0;
  s.min_lr = 0.1;
  s.warmup_steps = 10;
  s.total_steps = 110;
  s.decay_fraction = 0.2;
  return s;
}
}  // namespace

TEST(Schedule, WarmupIsLinearFromTheFirstStep) {
  for (auto k : {ScheduleKind::cosine, ScheduleKind::linear, ScheduleKind::wsd, ScheduleKind::constant}) {
    const ScheduleConfig s = make(k);
    EXPECT_DOUBLE_EQ(lr_at(s, 0), 0.1) << to_string(k);
    EXPECT_DOUBLE_EQ(lr_at(s, 4), 0.5) << to_string(k);
    EXPECT_DOUBLE_EQ(lr_at(s, 9), 1.0) << to_string(k);
    EXPECT_DOUBLE_EQ(lr_at(s, 10), 1.0) << to_string(k);  // first step after warmup: peak
  }
}

TEST(Schedule, CosineKeyPoints) {
  const ScheduleConfig s = make(ScheduleKind::cosine);
  EXPECT_DOUBLE_EQ(lr_at(s, 60), 0.55);  // halfway: mean of lr and min_lr
  EXPECT_DOUBLE_EQ(lr_at(s, 35), 0.1 + 0.9 * 0.5 * (1 + std::cos(std::numbers::pi * 0.25)));
  EXPECT_NEAR(lr_at(s, 109), 0.1 + 0.9 * 0.5 * (1 + std::cos(std::numbers::pi * 0.99)), 1e-15);
  EXPECT_DOUBLE_EQ(lr_at(s, 110), 0.1);
  EXPECT_DOUBLE_EQ(lr_at(s, 100000), 0.1);
  for (std::int64_t t = 10; t < 120; ++t) EXPECT_LE(lr_at(s, t + 1), lr_at(s, t)) << t;
}

TEST(Schedule, LinearKeyPoints) {
  const ScheduleConfig s = make(ScheduleKind::linear);
  EXPECT_DOUBLE_EQ(lr_at(s, 35), 1.0 - 0.9 * 0.25);
  EXPECT_DOUBLE_EQ(lr_at(s, 60), 0.55);
  EXPECT_DOUBLE_EQ(lr_at(s, 110), 0.1);
}

TEST(Schedule, WsdKeyPoints) {
  const ScheduleConfig s = make(ScheduleKind::wsd);  // decay: the last 22 of 110 steps, from 88
  EXPECT_DOUBLE_EQ(lr_at(s, 50), 1.0);
  EXPECT_DOUBLE_EQ(lr_at(s, 87), 1.0);
  EXPECT_DOUBLE_EQ(lr_at(s, 88), 1.0);
  EXPECT_DOUBLE_EQ(lr_at(s, 99), 1.0 - 0.9 * 11.0 / 22.0);
  EXPECT_DOUBLE_EQ(lr_at(s, 109), 1.0 - 0.9 * 21.0 / 22.0);
  EXPECT_DOUBLE_EQ(lr_at(s, 110), 0.1);
  ScheduleConfig none = s;
  none.decay_fraction = 0;
  EXPECT_DOUBLE_EQ(lr_at(none, 109), 1.0);
}

TEST(Schedule, ConstantAndNoWarmup) {
  ScheduleConfig s = make(ScheduleKind::constant);
  EXPECT_DOUBLE_EQ(lr_at(s, 500), 1.0);
  s = make(ScheduleKind::cosine);
  s.warmup_steps = 0;
  EXPECT_DOUBLE_EQ(lr_at(s, 0), 1.0);
  EXPECT_DOUBLE_EQ(lr_at(s, 55), 0.55);
}

TEST(Schedule, ParseAndValidate) {
  EXPECT_EQ(parse_schedule_kind("WSD"), ScheduleKind::wsd);
  EXPECT_EQ(parse_schedule_kind("cosine"), ScheduleKind::cosine);
  try {
    (void)parse_schedule_kind("step");
    FAIL();
  } catch (const ght::config_error& e) {
    EXPECT_NE(std::string(e.what()).find("cosine, linear, wsd, constant"), std::string::npos);
  }
  EXPECT_NO_THROW(make(ScheduleKind::wsd).validate());
  ScheduleConfig s = make(ScheduleKind::cosine);
  s.min_lr = 2.0;
  EXPECT_THROW(s.validate(), ght::config_error);
  s = make(ScheduleKind::cosine);
  s.warmup_steps = 111;
  EXPECT_THROW(s.validate(), ght::config_error);
  s = make(ScheduleKind::cosine);
  s.total_steps = 0;
  EXPECT_THROW(s.validate(), ght::config_error);
  s = make(ScheduleKind::wsd);
  s.decay_fraction = 1.5;
  EXPECT_THROW(s.validate(), ght::config_error);
  s.decay_fraction = 0.95;  // decay would start inside the warmup
  EXPECT_THROW(s.validate(), ght::config_error);
  s = make(ScheduleKind::linear);
  s.lr = 0;
  EXPECT_THROW(s.validate(), ght::config_error);
}
