// trainer/dist/launch.*: the launch read from synthetic environments (the process environment
// is never touched).
#include <gtest/gtest.h>

#include <string>

#include "tier/error.hpp"
#include "trainer/dist/launch.hpp"

namespace {

using ght::dist::detect_launch;
using ght::dist::Env;
using ght::dist::Launcher;

// The message of the config_error that detect_launch throws for `env` ("" when none).
std::string error_of(const Env& env) {
  try {
    (void)detect_launch(env);
  } catch (const ght::config_error& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_ERROR_HAS(env, text)                                 \
  do {                                                              \
    const std::string msg_ = error_of(env);                         \
    EXPECT_NE(msg_.find(text), std::string::npos) << "error: " << msg_; \
  } while (0)

TEST(DistLaunch, NoLauncherIsOneProcess) {
  const auto l = detect_launch(Env{{"PATH", "/bin"}, {"HOME", "/root"}});
  EXPECT_EQ(l.launcher, Launcher::none);
  EXPECT_EQ(l.rank, 0);
  EXPECT_EQ(l.world_size, 1);
  EXPECT_EQ(l.local_rank, 0);
}

TEST(DistLaunch, OpenMpi) {
  const auto l = detect_launch(
      Env{{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}});
  EXPECT_EQ(l.launcher, Launcher::open_mpi);
  EXPECT_EQ(l.rank, 3);
  EXPECT_EQ(l.world_size, 4);
  EXPECT_EQ(l.local_rank, 1);
  EXPECT_EQ(l.describe(), "rank 3 of 4 (local rank 1), launched by open-mpi");
}

TEST(DistLaunch, Torchrun) {
  const auto l = detect_launch(Env{{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"},
                                   {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500"}});
  EXPECT_EQ(l.launcher, Launcher::torchrun);
  EXPECT_EQ(l.rank, 5);
  EXPECT_EQ(l.world_size, 8);
  EXPECT_EQ(l.local_rank, 1);
  EXPECT_EQ(l.master_addr, "10.0.0.1");
  EXPECT_EQ(l.master_port, 29500);
  EXPECT_EQ(l.store_port, 29500);  // the bootstrap store's: MASTER_PORT itself
}

// Under torchrun itself the agent's store holds MASTER_PORT: ght's bootstrap store takes the next.
TEST(DistLaunch, TorchrunsAgentStoreMovesTheBootstrapStoreOnePortUp) {
  Env env{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500"},
          {"TORCHELASTIC_USE_AGENT_STORE", "True"}};
  EXPECT_EQ(detect_launch(env).store_port, 29501);
  env["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  EXPECT_EQ(detect_launch(env).store_port, 29500);
  env["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  env["MASTER_PORT"] = "65535";
  const std::string m = error_of(env);
  EXPECT_NE(m.find("MASTER_PORT=65535"), std::string::npos) << m;
  EXPECT_NE(m.find("TORCHELASTIC_USE_AGENT_STORE"), std::string::npos) << m;
}

TEST(DistLaunch, TorchrunOfOneNeedsNoMaster) {
  const auto l = detect_launch(Env{{"RANK", "0"}, {"WORLD_SIZE", "1"}});
  EXPECT_EQ(l.launcher, Launcher::torchrun);
  EXPECT_EQ(l.world_size, 1);
}

TEST(DistLaunch, Slurm) {
  const auto l = detect_launch(Env{{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "3"}, {"SLURM_LOCALID", "0"}});
  EXPECT_EQ(l.launcher, Launcher::slurm);
  EXPECT_EQ(l.rank, 2);
  EXPECT_EQ(l.world_size, 3);
  EXPECT_EQ(l.local_rank, 0);
}

TEST(DistLaunch, MissingLocalRankIsTheRank) {
  const auto l = detect_launch(Env{{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}});
  EXPECT_EQ(l.local_rank, 1);
}

// Slurm's variables are inherited by mpirun and torchrun inside an allocation: they lose.
TEST(DistLaunch, SlurmYieldsToMpiAndTorchrun) {
  Env env{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "16"}, {"SLURM_LOCALID", "0"},
          {"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}};
  auto l = detect_launch(env);
  EXPECT_EQ(l.launcher, Launcher::open_mpi);
  EXPECT_EQ(l.world_size, 2);
  env = {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"RANK", "3"}, {"WORLD_SIZE", "4"},
         {"LOCAL_RANK", "3"}, {"MASTER_ADDR", "n1"}, {"MASTER_PORT", "1234"}};
  l = detect_launch(env);
  EXPECT_EQ(l.launcher, Launcher::torchrun);
  EXPECT_EQ(l.rank, 3);
}

TEST(DistLaunch, MpiAndTorchrunThatAgreeAreFine) {
  const auto l = detect_launch(Env{{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                                   {"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "1"}});
  EXPECT_EQ(l.launcher, Launcher::open_mpi);
  EXPECT_EQ(l.rank, 1);
}

TEST(DistLaunch, MismatchedSizesBetweenSources) {
  EXPECT_ERROR_HAS((Env{{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"RANK", "0"},
                        {"WORLD_SIZE", "4"}}),
                   "WORLD_SIZE=4 disagrees with OMPI_COMM_WORLD_SIZE=2");
  EXPECT_ERROR_HAS((Env{{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"RANK", "1"},
                        {"WORLD_SIZE", "2"}}),
                   "RANK=1 disagrees with OMPI_COMM_WORLD_RANK=0");
}

TEST(DistLaunch, RankNotBelowWorldSize) {
  EXPECT_ERROR_HAS((Env{{"RANK", "3"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "1"}}),
                   "RANK=3 is not below WORLD_SIZE=2");
  EXPECT_ERROR_HAS((Env{{"RANK", "2"}, {"WORLD_SIZE", "2"}}), "RANK=2 is not below WORLD_SIZE=2");
  EXPECT_ERROR_HAS((Env{{"OMPI_COMM_WORLD_RANK", "4"}, {"OMPI_COMM_WORLD_SIZE", "4"}}),
                   "OMPI_COMM_WORLD_RANK=4 is not below OMPI_COMM_WORLD_SIZE=4");
  EXPECT_ERROR_HAS((Env{{"SLURM_PROCID", "9"}, {"SLURM_NTASKS", "2"}}), "SLURM_PROCID=9 is not below SLURM_NTASKS=2");
  EXPECT_ERROR_HAS((Env{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "2"}, {"MASTER_ADDR", "a"},
                        {"MASTER_PORT", "1"}}),
                   "LOCAL_RANK=2 is not below WORLD_SIZE=2");
}

TEST(DistLaunch, NonIntegerValues) {
  EXPECT_ERROR_HAS((Env{{"RANK", "one"}, {"WORLD_SIZE", "2"}}), "RANK=\"one\" is not a decimal integer");
  EXPECT_ERROR_HAS((Env{{"RANK", "0"}, {"WORLD_SIZE", "2x"}}), "WORLD_SIZE=\"2x\" is not a decimal integer");
  EXPECT_ERROR_HAS((Env{{"RANK", "0"}, {"WORLD_SIZE", ""}}), "WORLD_SIZE=\"\" is not a decimal integer");
  EXPECT_ERROR_HAS((Env{{"RANK", " 1"}, {"WORLD_SIZE", "2"}}), "RANK=\" 1\" is not a decimal integer");
  EXPECT_ERROR_HAS((Env{{"RANK", "+1"}, {"WORLD_SIZE", "2"}}), "RANK=\"+1\" is not a decimal integer");
  EXPECT_ERROR_HAS((Env{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1.5"}}), "SLURM_NTASKS=\"1.5\"");
  EXPECT_ERROR_HAS((Env{{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                        {"OMPI_COMM_WORLD_LOCAL_RANK", "a"}}),
                   "OMPI_COMM_WORLD_LOCAL_RANK=\"a\"");
  EXPECT_ERROR_HAS((Env{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "http"}}),
                   "MASTER_PORT=\"http\" is not a decimal integer");
}

TEST(DistLaunch, OutOfRangeValues) {
  EXPECT_ERROR_HAS((Env{{"RANK", "-1"}, {"WORLD_SIZE", "2"}}), "RANK=-1 is negative");
  EXPECT_ERROR_HAS((Env{{"RANK", "0"}, {"WORLD_SIZE", "0"}}), "WORLD_SIZE=0 is out of range [1, ");
  EXPECT_ERROR_HAS((Env{{"RANK", "0"}, {"WORLD_SIZE", "99999999999999999999"}}), "WORLD_SIZE=\"99999999999999999999\"");
  EXPECT_ERROR_HAS((Env{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "70000"}}),
                   "MASTER_PORT=70000 is out of range [1, 65535]");
  EXPECT_ERROR_HAS((Env{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "0"}}),
                   "MASTER_PORT=0 is out of range");
}

TEST(DistLaunch, MissingPartner) {
  EXPECT_ERROR_HAS((Env{{"RANK", "0"}}), "RANK is set but WORLD_SIZE is not");
  EXPECT_ERROR_HAS((Env{{"WORLD_SIZE", "2"}}), "WORLD_SIZE is set but RANK is not");
  EXPECT_ERROR_HAS((Env{{"LOCAL_RANK", "0"}}), "LOCAL_RANK is set but WORLD_SIZE is not");
  EXPECT_ERROR_HAS((Env{{"OMPI_COMM_WORLD_SIZE", "2"}}), "OMPI_COMM_WORLD_SIZE is set but OMPI_COMM_WORLD_RANK is not");
  EXPECT_ERROR_HAS((Env{{"SLURM_PROCID", "0"}}), "SLURM_PROCID is set but SLURM_NTASKS is not");
}

TEST(DistLaunch, TorchrunOfSeveralNeedsMaster) {
  EXPECT_ERROR_HAS((Env{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "29500"}}), "MASTER_ADDR is not set");
  EXPECT_ERROR_HAS((Env{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", ""}, {"MASTER_PORT", "29500"}}),
                   "MASTER_ADDR is empty");
  EXPECT_ERROR_HAS((Env{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}}), "MASTER_PORT is not set");
}

TEST(DistLaunch, ErrorsSayTheyAreAboutTheLaunch) {
  EXPECT_ERROR_HAS((Env{{"RANK", "3"}, {"WORLD_SIZE", "2"}}), "launch environment: ");
}

TEST(DistLaunch, DeviceDefaultsToLocalRank) {
  ght::dist::Launch l;
  l.local_rank = 3;
  EXPECT_EQ(ght::dist::default_device(l, std::nullopt), 3);
  EXPECT_EQ(ght::dist::default_device(l, 0), 0);  // GHT_DEVICE set explicitly wins
}

TEST(DistLaunch, ProcessEnvIsReadable) {
  // The real environment parses as a map; whatever launched the test, detection works or
  // throws config_error, never anything else.
  const Env env = ght::dist::process_env();
  EXPECT_FALSE(env.empty());
  try {
    (void)detect_launch(env);
  } catch (const ght::config_error&) {
  }
}

}  // namespace
