// SigV4 against AWS's published examples: the S3 header-based-auth examples
// (docs.aws.amazon.com/AmazonS3/latest/API/sig-v4-header-based-auth.html: GET object with a
// range, PUT object, GET bucket lifecycle, list objects) and the general test suite's
// get-vanilla and post-vanilla (docs.aws.amazon.com/general/latest/gr/signature-v4-test-suite).
#include "engine/objstore/sigv4.h"

#include <gtest/gtest.h>

namespace ckptfs::objstore {
namespace {

constexpr std::string_view kS3Key = "AKIAIOSFODNN7EXAMPLE";
constexpr std::string_view kS3Secret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";
constexpr std::string_view kS3Date = "20130524T000000Z";
constexpr std::string_view kHost = "examplebucket.s3.amazonaws.com";

SigningRequest S3Get(std::string uri, std::string query, std::vector<Param> extra = {}) {
  SigningRequest req{"GET", std::move(uri), std::move(query),
                     {{"Host", std::string(kHost)},
                      {"x-amz-content-sha256", std::string(kEmptySha256)},
                      {"x-amz-date", std::string(kS3Date)}},
                     std::string(kEmptySha256)};
  for (auto& h : extra) req.headers.push_back(std::move(h));
  return req;
}

TEST(SigV4, S3GetObjectWithRange) {
  SigningRequest req = S3Get("/test.txt", "", {{"Range", "bytes=0-9"}});
  EXPECT_EQ(CanonicalRequest(req),
            "GET\n/test.txt\n\nhost:examplebucket.s3.amazonaws.com\nrange:bytes=0-9\n"
            "x-amz-content-sha256:" + std::string(kEmptySha256) +
                "\nx-amz-date:20130524T000000Z\n\nhost;range;x-amz-content-sha256;x-amz-date\n" +
                std::string(kEmptySha256));
  EXPECT_EQ(StringToSign(kS3Date, "us-east-1", "s3", CanonicalRequest(req)),
            "AWS4-HMAC-SHA256\n20130524T000000Z\n20130524/us-east-1/s3/aws4_request\n"
            "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972");
  EXPECT_EQ(Authorization(kS3Key, kS3Secret, "us-east-1", "s3", kS3Date, req),
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/"
            "aws4_request,SignedHeaders=host;range;x-amz-content-sha256;x-amz-date,Signature="
            "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
}

TEST(SigV4, S3PutObject) {
  std::string body_hash = Sha256Hex(AsBytes("Welcome to Amazon S3."));
  EXPECT_EQ(body_hash, "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072");
  SigningRequest req{"PUT",
                     std::string("/").append(UriEncode("test$file.text", false)),
                     "",
                     {{"Host", std::string(kHost)},
                      {"Date", "Fri, 24 May 2013 00:00:00 GMT"},
                      {"x-amz-date", std::string(kS3Date)},
                      {"x-amz-storage-class", "REDUCED_REDUNDANCY"},
                      {"x-amz-content-sha256", body_hash}},
                     body_hash};
  EXPECT_EQ(req.canonical_uri, "/test%24file.text");
  std::string to_sign = StringToSign(kS3Date, "us-east-1", "s3", CanonicalRequest(req));
  EXPECT_EQ(to_sign.substr(to_sign.size() - 64),
            "9e0e90d9c76de8fa5b200d8c849cd5b8dc7a3be3951ddb7f6a76b4158342019d");
  EXPECT_EQ(SignedHeaders(req), "date;host;x-amz-content-sha256;x-amz-date;x-amz-storage-class");
  EXPECT_EQ(Signature(kS3Secret, kS3Date, "us-east-1", "s3", req),
            "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd");
}

TEST(SigV4, S3GetBucketLifecycle) {
  SigningRequest req = S3Get("/", CanonicalQuery({{"lifecycle", ""}}));
  EXPECT_EQ(req.canonical_query, "lifecycle=");
  EXPECT_EQ(Signature(kS3Secret, kS3Date, "us-east-1", "s3", req),
            "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543");
}

TEST(SigV4, S3ListObjects) {
  SigningRequest req = S3Get("/", CanonicalQuery({{"prefix", "J"}, {"max-keys", "2"}}));
  EXPECT_EQ(req.canonical_query, "max-keys=2&prefix=J");
  EXPECT_EQ(Signature(kS3Secret, kS3Date, "us-east-1", "s3", req),
            "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7");
}

TEST(SigV4, TestSuiteVanilla) {
  constexpr std::string_view kSecret = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";
  SigningRequest get{"GET", "/", "",
                     {{"Host", "example.amazonaws.com"}, {"X-Amz-Date", "20150830T123600Z"}},
                     std::string(kEmptySha256)};
  EXPECT_EQ(Authorization("AKIDEXAMPLE", kSecret, "us-east-1", "service", "20150830T123600Z",
                          get),
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request,"
            "SignedHeaders=host;x-amz-date,Signature="
            "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31");
  SigningRequest post = get;
  post.method = "POST";
  EXPECT_EQ(Signature(kSecret, "20150830T123600Z", "us-east-1", "service", post),
            "5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b");
}

TEST(SigV4, HeaderValuesTrimmedAndCollapsed) {
  SigningRequest req{"GET", "/", "", {{"X-Amz-Meta-A", "  a   b  c "}, {"host", "h"}}, "x"};
  EXPECT_EQ(CanonicalRequest(req), "GET\n/\n\nhost:h\nx-amz-meta-a:a b c\n\nhost;x-amz-meta-a\nx");
}

TEST(SigV4, UriEncodeAndQuery) {
  EXPECT_EQ(UriEncode("a b+c%/d~e_f.g-h", false), "a%20b%2Bc%25/d~e_f.g-h");
  EXPECT_EQ(UriEncode("a/b", true), "a%2Fb");
  EXPECT_EQ(UriEncode("\xc3\xa9", false), "%C3%A9");
  EXPECT_EQ(CanonicalQuery({{"prefix", "p/q"}, {"continuation-token", "a+b="}, {"list-type", "2"}}),
            "continuation-token=a%2Bb%3D&list-type=2&prefix=p%2Fq");
  EXPECT_EQ(CanonicalQuery({{"b", "2"}, {"a", "y"}, {"a", "x"}}), "a=x&a=y&b=2");
}

TEST(SigV4, AmzDate) {
  EXPECT_EQ(AmzDate(std::chrono::system_clock::time_point(std::chrono::seconds(1369353600))),
            "20130524T000000Z");
}

}  // namespace
}  // namespace ckptfs::objstore
