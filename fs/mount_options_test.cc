#include "fs/mount_options.h"

#include <gtest/gtest.h>

namespace ckptfs {
namespace {

TEST(ParseSize, UnitsArePowersOf1024) {
  EXPECT_EQ(*ParseSize("4096"), 4096u);
  EXPECT_EQ(*ParseSize("64K"), 64u << 10);
  EXPECT_EQ(*ParseSize("256M"), 256u << 20);
  EXPECT_EQ(*ParseSize("2g"), size_t{2} << 30);
  EXPECT_FALSE(ParseSize("").ok());
  EXPECT_FALSE(ParseSize("M").ok());
  EXPECT_EQ(*ParseSize("1T"), size_t{1} << 40);
  EXPECT_FALSE(ParseSize("12P").ok());
  EXPECT_FALSE(ParseSize("-1M").ok());
  EXPECT_FALSE(ParseSize("99999999999999999999").ok());
  EXPECT_FALSE(ParseSize("17179869184G").ok());  // 2^64 bytes
  EXPECT_FALSE(ParseSize("16777216T").ok());     // 2^64 bytes
}

TEST(ApplyMountOptions, CreateAllowsANewStore) {
  MountArgs args;
  EXPECT_FALSE(args.create);
  ASSERT_TRUE(ApplyMountOptions("create,cache_size=1T", &args).ok());
  EXPECT_TRUE(args.create);
  EXPECT_EQ(args.cache_bytes, size_t{1} << 40);
}

TEST(ApplyMountOptions, DaemonOptionsSetTheirFlags) {
  MountArgs args;
  ASSERT_TRUE(ApplyMountOptions("cache_size=128M,inflight=64M,codec=zstd:5,delta_chain=3,"
                                "seal_after=2.5,snapshot_timeout=60",
                                &args)
                  .ok());
  EXPECT_EQ(args.cache_bytes, 128u << 20);
  EXPECT_EQ(args.inflight_bytes, 64u << 20);
  EXPECT_EQ(args.codec->ToString(), CodecSpec::Parse("zstd:5")->ToString());
  EXPECT_EQ(args.max_delta_chain, 3u);
  EXPECT_EQ(args.seal_after, std::chrono::milliseconds(2500));
  EXPECT_EQ(args.snapshot_timeout, std::chrono::seconds(60));
  EXPECT_TRUE(args.fuse_options.empty());
}

TEST(ApplyMountOptions, MountOnlyOptionsAreDroppedAndTheRestGoToFuse) {
  MountArgs args;
  ASSERT_TRUE(ApplyMountOptions("defaults,rw,noauto,nofail,_netdev,x-systemd.automount,"
                                "comment=x,allow_other,,noatime,user",
                                &args)
                  .ok());
  EXPECT_EQ(args.fuse_options, (std::vector<std::string>{"rw", "allow_other", "noatime"}));
}

TEST(ApplyMountOptions, LaterOptionsWin) {
  MountArgs args;
  ASSERT_TRUE(ApplyMountOptions("codec=none,cache_size=1M", &args).ok());
  ASSERT_TRUE(ApplyMountOptions("cache_size=2M", &args).ok());
  EXPECT_EQ(args.cache_bytes, 2u << 20);
  EXPECT_EQ(args.codec->ToString(), CodecSpec::Parse("none")->ToString());
}

TEST(ApplyMountOptions, BadValuesAreRefusedByName) {
  MountArgs args;
  for (const char* bad :
       {"cache_size=lots", "cache_size", "cache_size=", "codec=gzip", "delta_chain=0",
        "delta_chain=65", "seal_after=soon", "seal_after=-1", "snapshot_timeout=0"}) {
    Status s = ApplyMountOptions(bad, &args);
    EXPECT_FALSE(s.ok()) << bad;
  }
  Status s = ApplyMountOptions("inflight=9Q", &args);
  EXPECT_NE(s.ToString().find("9Q"), std::string::npos) << s.ToString();
}

}  // namespace
}  // namespace ckptfs

namespace ckptfs {
namespace {

TEST(ApplyMountOptions, KeepLastAndKeepEverySetRotation) {
  MountArgs args;
  EXPECT_EQ(args.keep_last, 0u);  // no rotation unless asked
  ASSERT_TRUE(ApplyMountOptions("keep_last=3,keep_every=10", &args).ok());
  EXPECT_EQ(args.keep_last, 3u);
  EXPECT_EQ(args.keep_every, 10u);
  EXPECT_TRUE(args.fuse_options.empty());
  ASSERT_TRUE(ApplyMountOptions("prometheus=9464", &args).ok());
  EXPECT_EQ(args.prometheus_port, 9464);
  for (const char* bad : {"keep_last=0", "keep_last=", "keep_last=x", "keep_every=-1",
                          "prometheus=0", "prometheus=70000", "prometheus"}) {
    Status s = ApplyMountOptions(bad, &args);
    EXPECT_FALSE(s.ok()) << bad;
    EXPECT_NE(s.ToString().find(std::string(bad).substr(0, 9)), std::string::npos) << s.ToString();
  }
}

}  // namespace
}  // namespace ckptfs

namespace ckptfs {
namespace {

TEST(ApplyMountOptions, ControlGroupNamesAGroupForTheDaemon) {
  MountArgs args;
  EXPECT_TRUE(args.control_group.empty());  // the daemon's user only unless asked
  ASSERT_TRUE(ApplyMountOptions("control_group=trainers,group", &args).ok());
  EXPECT_EQ(args.control_group, "trainers");
  EXPECT_TRUE(args.fuse_options.empty());  // neither reaches FUSE (`group` is mount(8)'s)
  EXPECT_FALSE(ApplyMountOptions("control_group=", &args).ok());
  EXPECT_FALSE(ApplyMountOptions("control_group", &args).ok());
}

}  // namespace
}  // namespace ckptfs
