#include "engine/objstore/s3_xml.h"

#include <gtest/gtest.h>

namespace ckptfs::objstore {
namespace {

TEST(S3Xml, ElementsAndEntities) {
  std::string xml = "<a><k>x &amp; y</k><k/><k>&lt;&#65;&#x42;&quot;&apos;&gt;&bogus;</k></a>";
  std::vector<std::string> ks = XmlElements(xml, "k");
  ASSERT_EQ(ks.size(), 3u);
  EXPECT_EQ(ks[0], "x & y");
  EXPECT_EQ(ks[1], "");
  EXPECT_EQ(ks[2], "<AB\"'>&bogus;");
  EXPECT_EQ(XmlElement(xml, "missing"), std::nullopt);
  EXPECT_EQ(XmlElement("<a><b>&#233;</b></a>", "b"), "\xc3\xa9");
  EXPECT_EQ(XmlEscape("<\"a&b'>"), "&lt;&quot;a&amp;b&apos;&gt;");
}

TEST(S3Xml, Error) {
  S3Error e = ParseS3Error(
      "<?xml version=\"1.0\"?><Error><Code>NoSuchKey</Code><Message>gone</Message>"
      "<RequestId>tx1</RequestId></Error>");
  EXPECT_EQ(e.code, "NoSuchKey");
  EXPECT_EQ(e.message, "gone");
  EXPECT_EQ(ParseS3Error("not xml").code, "");
}

TEST(S3Xml, ListObjectsV2Pages) {
  std::string page1 =
      "<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Name>b</Name>"
      "<Prefix>p/</Prefix><KeyCount>2</KeyCount><MaxKeys>2</MaxKeys>"
      "<IsTruncated>true</IsTruncated><NextContinuationToken>tok+/=</NextContinuationToken>"
      "<Contents><Key>p/a&amp;b</Key><LastModified>2013-05-24T00:00:01.000Z</LastModified>"
      "<ETag>&quot;abc&quot;</ETag><Size>12</Size><StorageClass>STANDARD</StorageClass>"
      "</Contents><Contents><Key>p/c</Key><LastModified>2013-05-24T00:00:00.000Z</LastModified>"
      "<ETag>\"def-2\"</ETag><Size>0</Size></Contents></ListBucketResult>";
  Result<ListPage> p = ParseListObjectsV2(page1);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ASSERT_EQ(p->objects.size(), 2u);
  EXPECT_EQ(p->objects[0].key, "p/a&b");
  EXPECT_EQ(p->objects[0].size, 12u);
  EXPECT_EQ(p->objects[0].etag, "abc");
  EXPECT_EQ(p->objects[0].last_modified, 1369353601);
  EXPECT_EQ(p->objects[1].etag, "def-2");
  EXPECT_EQ(p->next_continuation_token, "tok+/=");

  Result<ListPage> last = ParseListObjectsV2(
      "<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>");
  ASSERT_TRUE(last.ok());
  EXPECT_TRUE(last->objects.empty());
  EXPECT_EQ(last->next_continuation_token, "");

  EXPECT_TRUE(ParseListObjectsV2("<Error/>").status().IsCorruption());
  EXPECT_TRUE(ParseListObjectsV2("<ListBucketResult><IsTruncated>true</IsTruncated>"
                                 "</ListBucketResult>").status().IsCorruption());
  EXPECT_TRUE(ParseListObjectsV2("<ListBucketResult><Contents><Key>k</Key><Size>1x</Size>"
                                 "</Contents></ListBucketResult>").status().IsCorruption());
}

TEST(S3Xml, Uploads) {
  Result<UploadsPage> p = ParseListMultipartUploads(
      "<ListMultipartUploadsResult><Bucket>b</Bucket><IsTruncated>true</IsTruncated>"
      "<NextKeyMarker>k2</NextKeyMarker><NextUploadIdMarker>u2</NextUploadIdMarker>"
      "<Upload><Key>k1</Key><UploadId>u1</UploadId>"
      "<Initiated>2013-05-24T00:00:00.000Z</Initiated></Upload></ListMultipartUploadsResult>");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ASSERT_EQ(p->uploads.size(), 1u);
  EXPECT_EQ(std::get<0>(p->uploads[0]), "k1");
  EXPECT_EQ(std::get<1>(p->uploads[0]), "u1");
  EXPECT_EQ(std::get<2>(p->uploads[0]), 1369353600);
  EXPECT_EQ(p->next_key_marker, "k2");
  EXPECT_EQ(p->next_upload_id_marker, "u2");
}

TEST(S3Xml, CompleteBody) {
  EXPECT_EQ(CompleteMultipartBody({{1, "\"e1\""}, {2, "\"e2\""}}),
            "<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>&quot;e1&quot;"
            "</ETag></Part><Part><PartNumber>2</PartNumber><ETag>&quot;e2&quot;</ETag></Part>"
            "</CompleteMultipartUpload>");
}

TEST(S3Xml, Iso8601) {
  EXPECT_EQ(ParseIso8601("1970-01-01T00:00:00.000Z"), 0);
  EXPECT_EQ(ParseIso8601("2013-05-24T00:00:00Z"), 1369353600);
  EXPECT_EQ(ParseIso8601("yesterday"), std::nullopt);
}

}  // namespace
}  // namespace ckptfs::objstore
