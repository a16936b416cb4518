import Foundation
import Logging
import Testing
import UbiqS3
import UbiqStore

/// Each backend reads its own URLs and no other's, says wrong ones in a line, and opens its
/// store with what a device binds to (the command line chooses among them: `MountPlan.storeBackends`).
@Suite struct StoreBackendTests {
    static let options = StoreURLOptions(environment: ["AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"],
                                         absolute: { $0.hasPrefix("/") ? $0 : "/here/" + $0 })

    @Test func eachBackendTakesItsOwnURLsOnly() throws {
        let o = Self.options
        #expect(try DirectoryBackend.parse("dir:/a/b", o)?.url == "dir:/a/b")
        #expect(try DirectoryBackend.parse("rel/x", o)?.path == "/here/rel/x")
        for other in ["s3://bucket/p", "gs://bucket", "s3:/bucket", "S3:bucket"] {
            #expect(try DirectoryBackend.parse(other, o) == nil, "\(other)")
        }
        #expect(throws: StoreURLError.self) { try DirectoryBackend.parse("dir:", o) }

        let s3 = try #require(try S3Backend.parse("s3://bucket/some/prefix", o))
        #expect(s3.url == "s3://bucket/some/prefix/" && s3.address == s3.url && s3.folder == nil)
        #expect(s3.region == "us-east-1" && s3.endpoint.absoluteString == "https://s3.us-east-1.amazonaws.com")
        #expect(s3.daemonArguments == ["--s3-endpoint", "https://s3.us-east-1.amazonaws.com", "--s3-region", "us-east-1"])
        #expect(try S3Backend.parse("dir:/a", o) == nil)
        #expect(try S3Backend.parse("/a/b", o) == nil)
        for bad in ["s3://B_ad", "s3://ab"] {
            #expect(throws: StoreURLError.self, "\(bad)") { try S3Backend.parse(bad, o) }
        }
        var region = o
        region.s3Region = "us east"
        #expect(throws: StoreURLError.self) { try S3Backend.parse("s3://bucket", region) }
        var endpoint = o
        endpoint.s3Endpoint = "ftp://host"
        #expect(throws: StoreURLError.self) { try S3Backend.parse("s3://bucket", endpoint) }
    }

    /// The embedded store opens with its identity and quota; a command that reads a store
    /// makes none where there is none.
    @Test func theEmbeddedStoreOpensWithWhatADeviceBindsTo() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("ubiq-backend-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let backend = DirectoryBackend(path: dir)
        let logger = Logger(label: "test")
        await #expect(throws: StoreURLError.self) {
            try await backend.open(StoreOpening(indexPath: "", logger: logger, mustExist: true))
        }
        #expect(!FileManager.default.fileExists(atPath: dir))
        let opened = try await backend.open(StoreOpening(indexPath: "", logger: logger))
        let again = try await backend.open(StoreOpening(indexPath: "", logger: logger, mustExist: true))
        #expect(opened.identity != nil && opened.identity == again.identity)
        try opened.setQuota?(1 << 20)
        #expect(opened.setQuota != nil)
    }
}
