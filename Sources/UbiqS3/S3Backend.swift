import Foundation
import UbiqStore

/// An S3 store (`s3://BUCKET/PREFIX`): its endpoint and region from the command line, else
/// the environment as the AWS tools read it; its credentials as they do (`S3Credentials`).
public struct S3Backend: StoreBackend {
    public let location: S3Location
    public let endpoint: URL
    public let region: String
    /// What the credentials are read from when the store opens (`StoreURLOptions.environment`).
    let environment: [String: String]

    public static func parse(_ url: String, _ options: StoreURLOptions) throws -> S3Backend? {
        guard url.hasPrefix("s3://") else { return nil }
        let location: S3Location
        do { location = try S3Location(url) } catch { throw StoreURLError("\(error)".replacingOccurrences(of: "store error: ", with: "")) }
        let env = options.environment
        let region = options.s3Region ?? env["AWS_REGION"] ?? env["AWS_DEFAULT_REGION"] ?? "us-east-1"
        guard !region.isEmpty, region.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "-") }) else {
            throw StoreURLError("invalid --s3-region \(region.debugDescription)")
        }
        let text = options.s3Endpoint ?? env["AWS_ENDPOINT_URL_S3"] ?? env["AWS_ENDPOINT_URL"] ?? "https://s3.\(region).amazonaws.com"
        guard let endpoint = URL(string: text), ["http", "https"].contains(endpoint.scheme ?? ""), endpoint.host != nil,
              endpoint.path.isEmpty || endpoint.path == "/" else {
            throw StoreURLError("invalid S3 endpoint \(text): use http(s)://HOST[:PORT]")
        }
        do { _ = try S3Credentials.resolve(environment: env, home: NSHomeDirectory()) } catch { throw StoreURLError("\(error)") }
        return S3Backend(location: location, endpoint: endpoint, region: region, environment: env)
    }

    public init(location: S3Location, endpoint: URL, region: String,
                environment: [String: String] = ProcessInfo.processInfo.environment) {
        self.location = location
        self.endpoint = endpoint
        self.region = region
        self.environment = environment
    }

    public var url: String { "s3://\(location.bucket)/\(location.prefix)" }
    public var address: String { url }
    public var folder: String? { nil }
    public var transfers: Int { 8 }
    /// Each chunk is one request: over HTTP, 4 MiB ones read a 256 MiB object cold at about
    /// twice the speed of 1 MiB ones, for a few ms more before the first byte, and 8 of 8 MiB
    /// at once another sixth faster than 4 of 4 MiB, as fast as one plain GET (docs/s3.md).
    public var chunks: (size: Int, parallel: Int)? { (8 << 20, 8) }
    public var daemonArguments: [String] { ["--s3-endpoint", endpoint.absoluteString, "--s3-region", region] }

    public func open(_ how: StoreOpening) async throws -> OpenedStore {
        let credentials = try S3Credentials.resolve(environment: environment, home: NSHomeDirectory())
        let store = try await S3Store.open(location, endpoint: endpoint, region: region, credentials: credentials,
                                           indexPath: how.indexPath, logger: how.logger, fullListingInterval: how.fullListingInterval)
        return OpenedStore(store: store)
    }
}
