import Foundation
import Testing
@testable import UbiqS3

/// The signer against the four examples AWS publishes for S3 (Signature Version 4,
/// header-based: https://docs.aws.amazon.com/AmazonS3/latest/API/sig-v4-header-based-auth.html).
@Suite struct SigV4Tests {
    let example = SigV4(accessKey: "AKIAIOSFODNN7EXAMPLE", secretKey: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
                        region: "us-east-1")
    let may24 = Date(timeIntervalSince1970: 1_369_353_600)  // 2013-05-24T00:00:00Z
    let host = ["Host": "examplebucket.s3.amazonaws.com"]

    func signature(_ headers: [String: String]) -> String {
        String(headers["Authorization"]?.split(separator: "=").last ?? "")
    }

    @Test func getObjectWithARange() {
        let h = example.sign(method: "GET", path: "/test.txt", query: [], headers: host.merging(["Range": "bytes=0-9"]) { a, _ in a },
                             payloadHash: SigV4.emptyPayloadHash, date: may24)
        #expect(signature(h) == "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41")
        #expect(h["Authorization"]?.contains("SignedHeaders=host;range;x-amz-content-sha256;x-amz-date") == true)
        #expect(h["x-amz-date"] == "20130524T000000Z")
    }

    @Test func putObjectWithAnEncodedKey() {
        let body = Data("Welcome to Amazon S3.".utf8)
        #expect(SigV4.sha256Hex(body) == "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072")
        let h = example.sign(method: "PUT", path: SigV4.encodePath("/test$file.text"), query: [],
                             headers: host.merging(["Date": "Fri, 24 May 2013 00:00:00 GMT",
                                                    "x-amz-storage-class": "REDUCED_REDUNDANCY"]) { a, _ in a },
                             payloadHash: SigV4.sha256Hex(body), date: may24)
        #expect(signature(h) == "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd")
    }

    @Test func getBucketLifecycle() {
        let h = example.sign(method: "GET", path: "/", query: [("lifecycle", "")], headers: host,
                             payloadHash: SigV4.emptyPayloadHash, date: may24)
        #expect(signature(h) == "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543")
    }

    @Test func listObjectsWithAQuery() {
        let h = example.sign(method: "GET", path: "/", query: [("prefix", "J"), ("max-keys", "2")], headers: host,
                             payloadHash: SigV4.emptyPayloadHash, date: may24)
        #expect(signature(h) == "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7")
    }

    /// URI encoding, query order, header values and dates, as the specification gives them.
    @Test func encodingFollowsTheRules() {
        #expect(SigV4.uriEncode("a b+c/d~e", keepSlash: true) == "a%20b%2Bc/d~e")
        #expect(SigV4.uriEncode("a/b", keepSlash: false) == "a%2Fb")
        #expect(SigV4.uriEncode("ключ", keepSlash: false) == "%D0%BA%D0%BB%D1%8E%D1%87")
        #expect(SigV4.canonicalQuery([("prefix", "a b/"), ("list-type", "2"), ("continuation-token", "x=y")])
                == "continuation-token=x%3Dy&list-type=2&prefix=a%20b%2F")
        #expect(SigV4.trimmed("  a   b  ") == "a b")
        #expect(SigV4.amzDate(Date(timeIntervalSince1970: 1_440_938_160)) == "20150830T123600Z")
    }

    @Test func aSessionTokenIsSentAndSigned() {
        var withToken = example
        withToken.sessionToken = "token"
        let a = withToken.sign(method: "GET", path: "/k", query: [], headers: host, payloadHash: SigV4.emptyPayloadHash, date: may24)
        let b = example.sign(method: "GET", path: "/k", query: [], headers: host, payloadHash: SigV4.emptyPayloadHash, date: may24)
        #expect(a["x-amz-security-token"] == "token")
        #expect(a["Authorization"]?.contains("x-amz-security-token") == true)
        #expect(signature(a) != signature(b))
    }
}
