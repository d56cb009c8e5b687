#include "engine/objstore/s3_config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>

namespace ckptfs::objstore {
namespace {

struct FakeEnv {
  std::map<std::string, std::string> vars;
  Environment env() const {
    return [this](const char* name) -> const char* {
      auto it = vars.find(name);
      return it == vars.end() ? nullptr : it->second.c_str();
    };
  }
};

TEST(S3Location, Parse) {
  Result<S3Location> loc = ParseS3Location("s3://ckpts/run7/a/");
  ASSERT_TRUE(loc.ok()) << loc.status().ToString();
  EXPECT_EQ(loc->bucket, "ckpts");
  EXPECT_EQ(loc->prefix, "run7/a");
  EXPECT_EQ(loc->Key("packs/x"), "run7/a/packs/x");
  EXPECT_EQ(loc->ToString(), "s3://ckpts/run7/a");
  Result<S3Location> bare = ParseS3Location("s3://ckpts");
  ASSERT_TRUE(bare.ok());
  EXPECT_EQ(bare->prefix, "");
  EXPECT_EQ(bare->Key("x"), "x");
  for (const char* bad : {"/tmp/x", "s3://", "s3://ab", "s3://Upper/x", "s3://-ab/x",
                          "s3://a_b/x", "s3://bucket//x"}) {
    EXPECT_FALSE(ParseS3Location(bad).ok()) << bad;
  }
}

TEST(S3Config, FromEnvironment) {
  FakeEnv e{{{"AWS_ACCESS_KEY_ID", "AK"}, {"AWS_SECRET_ACCESS_KEY", "SK"},
             {"AWS_ENDPOINT_URL", "http://127.0.0.1:7480/"}, {"AWS_DEFAULT_REGION", "eu-1"},
             {"HOME", "/nonexistent"}}};
  Result<S3Config> cfg = ResolveS3Config("", e.env());
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  EXPECT_EQ(cfg->credentials.access_key_id, "AK");
  EXPECT_EQ(cfg->credentials.secret_access_key, "SK");
  EXPECT_EQ(cfg->endpoint, "http://127.0.0.1:7480");
  EXPECT_EQ(cfg->region, "eu-1");
  // An explicit endpoint wins, and so does AWS_ENDPOINT_URL_S3 over AWS_ENDPOINT_URL.
  EXPECT_EQ(ResolveS3Config("https://s3.example", e.env())->endpoint, "https://s3.example");
  e.vars["AWS_ENDPOINT_URL_S3"] = "http://s3only:1";
  EXPECT_EQ(ResolveS3Config("", e.env())->endpoint, "http://s3only:1");
}

TEST(S3Config, FromProfileFiles) {
  std::filesystem::path dir = std::filesystem::temp_directory_path() /
                              ("s3cfg-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir / ".aws");
  std::ofstream(dir / ".aws/credentials")
      << "[default]\naws_access_key_id = DEF\naws_secret_access_key = DEFS\n\n"
         "# comment\n[train]\naws_access_key_id=TK\naws_secret_access_key = TS \n"
         "aws_session_token = TT\n";
  std::ofstream(dir / ".aws/config")
      << "[default]\nregion = r0\n[profile train]\nregion = r1\n"
         "endpoint_url = http://rgw:7480\ns3 =\n  addressing_style = path\n";
  FakeEnv e{{{"HOME", dir.string()}}};
  Result<S3Config> def = ResolveS3Config("http://x:1", e.env());
  ASSERT_TRUE(def.ok()) << def.status().ToString();
  EXPECT_EQ(def->credentials.access_key_id, "DEF");
  EXPECT_EQ(def->region, "r0");
  e.vars["AWS_PROFILE"] = "train";
  Result<S3Config> train = ResolveS3Config("", e.env());
  ASSERT_TRUE(train.ok()) << train.status().ToString();
  EXPECT_EQ(train->credentials.access_key_id, "TK");
  EXPECT_EQ(train->credentials.secret_access_key, "TS");
  EXPECT_EQ(train->credentials.session_token, "TT");
  EXPECT_EQ(train->endpoint, "http://rgw:7480");
  EXPECT_EQ(train->region, "r1");
  std::filesystem::remove_all(dir);
}

TEST(S3Config, MissingPiecesSayWhatToDo) {
  FakeEnv none{{{"HOME", "/nonexistent"}}};
  Result<S3Config> cfg = ResolveS3Config("http://x:1", none.env());
  ASSERT_FALSE(cfg.ok());
  EXPECT_NE(cfg.status().message().find("AWS_ACCESS_KEY_ID"), std::string::npos);
  FakeEnv keys{{{"HOME", "/nonexistent"}, {"AWS_ACCESS_KEY_ID", "AK"},
                {"AWS_SECRET_ACCESS_KEY", "sekrit"}}};
  cfg = ResolveS3Config("", keys.env());
  ASSERT_FALSE(cfg.ok());
  EXPECT_NE(cfg.status().message().find("--endpoint"), std::string::npos);
  EXPECT_EQ(cfg.status().message().find("sekrit"), std::string::npos);
  EXPECT_FALSE(ResolveS3Config("ftp://x", keys.env()).ok());
  EXPECT_FALSE(ResolveS3Config("http://x/bucket", keys.env()).ok());
}

}  // namespace
}  // namespace ckptfs::objstore
