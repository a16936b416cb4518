// swift-tools-version:6.0
import PackageDescription

let package = Package(
    name: "Ubiquity",
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "ubiq", targets: ["ubiq"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.5.0"),
        .package(url: "https://github.com/apple/swift-log", from: "1.6.0"),
        .package(url: "https://github.com/groue/GRDB.swift", from: "7.0.0"),
        .package(url: "https://github.com/apple/swift-nio", from: "2.100.0"),
        .package(url: "https://github.com/swift-server/async-http-client", from: "1.37.0"),
    ],
    targets: [
        .systemLibrary(name: "CFuse", path: "Modules/CFuse", pkgConfig: "fuse3",
                       providers: [.apt(["libfuse3-dev"])]),
        // SHA-256 and HMAC from the system's libcrypto (libssl-dev): swift-crypto built a second
        // BoringSSL (async-http-client's swift-nio-ssl has one), minutes of every cold build.
        .target(name: "CUbiq", linkerSettings: [.linkedLibrary("crypto")]),
        .target(name: "UbiqStore", dependencies: [
            "UbiqClock", "CUbiq",
            .product(name: "GRDB", package: "GRDB.swift"),
            .product(name: "Logging", package: "swift-log"),
        ]),
        .target(name: "UbiqS3", dependencies: [
            "UbiqStore", "UbiqClock",
            .product(name: "GRDB", package: "GRDB.swift"),
            .product(name: "AsyncHTTPClient", package: "async-http-client"),
            .product(name: "NIOCore", package: "swift-nio"),
            .product(name: "NIOHTTP1", package: "swift-nio"),
            .product(name: "Logging", package: "swift-log"),
        ]),
        // The time the sync decisions go by (upload delays, retries), which tests move themselves.
        .target(name: "UbiqClock"),
        .target(name: "UbiqState", dependencies: [
            "UbiqClock",
            .product(name: "GRDB", package: "GRDB.swift"),
        ]),
        .target(name: "UbiqCoordinator", dependencies: ["UbiqClock"]),
        .target(name: "UbiqSync", dependencies: [
            "UbiqStore", "UbiqState", "UbiqClock", "UbiqCoordinator", "CUbiq",
            .product(name: "Logging", package: "swift-log"),
        ]),
        .target(name: "UbiqFS", dependencies: [
            "UbiqStore", "UbiqState", "UbiqClock", "UbiqCoordinator", "UbiqSync", "CUbiq",
            .product(name: "Logging", package: "swift-log"),
        ]),
        // The control socket: its typed requests and answers, the daemon's server, and the
        // connection the CLI and the tests ask on.
        .target(name: "UbiqControl", dependencies: [
            "UbiqFS", "UbiqState", "UbiqStore", "UbiqSync", "CUbiq",
            .product(name: "Logging", package: "swift-log"),
        ]),
        // The FUSE device's traffic, for what libfuse 3.14 does not pass on (KILLPRIV_V2).
        .target(name: "CUbiqFuse", dependencies: ["CFuse"]),
        .target(name: "UbiqFuse", dependencies: [
            "CFuse", "CUbiqFuse", "UbiqFS", "UbiqClock",
            .product(name: "Logging", package: "swift-log"),
        ]),
        .executableTarget(name: "ubiq", dependencies: [
            "UbiqFuse", "UbiqFS", "UbiqControl", "UbiqStore", "UbiqS3", "UbiqState", "UbiqSync", "UbiqCoordinator", "UbiqClock", "CUbiq",
            .product(name: "ArgumentParser", package: "swift-argument-parser"),
            .product(name: "Logging", package: "swift-log"),
        ]),
        // Helpers the test targets share (temporary paths, waiting for a condition).
        .target(name: "TestSupport", dependencies: ["UbiqS3", .product(name: "Logging", package: "swift-log")], path: "Tests/TestSupport"),
        .testTarget(name: "CoordinatorTests", dependencies: ["UbiqCoordinator", "UbiqClock", "TestSupport"]),
        .testTarget(name: "StoreTests", dependencies: [
            "UbiqStore", "UbiqS3", "TestSupport",
            .product(name: "Logging", package: "swift-log"),
            .product(name: "NIOCore", package: "swift-nio"),
            .product(name: "NIOHTTP1", package: "swift-nio"),
        ]),
        .testTarget(name: "FileSystemTests", dependencies: [
            "UbiqFS", "UbiqControl", "UbiqStore", "UbiqState", "UbiqClock", "UbiqSync", "UbiqCoordinator", "UbiqS3", "TestSupport",
            .product(name: "GRDB", package: "GRDB.swift"),
        ]),
        .testTarget(name: "MountTests", dependencies: ["TestSupport"]),
    ]
)
