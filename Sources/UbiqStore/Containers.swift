import Foundation

/// One app's document space in a store, as iCloud's NSUbiquitousContainers describe it.
public struct ContainerConfig: Codable, Equatable, Sendable {
    public var name: String
    public var displayName: String
    /// How deep folders may go in Documents: "none", "one" or "any".
    public var folderLevels: String
    /// Whether its Documents are for people to see (iCloud Drive shows such a container's folder).
    public var publicDocuments: Bool

    public init(name: String, displayName: String, folderLevels: String, publicDocuments: Bool) {
        self.name = name; self.displayName = displayName; self.folderLevels = folderLevels; self.publicDocuments = publicDocuments
    }

    /// The folder levels as a depth (nil: any).
    public var maxFolderDepth: Int? {
        switch folderLevels {
        case "none": return 0
        case "one": return 1
        default: return nil
        }
    }
}

/// Containers in a store: each under `.ubiquity/containers/NAME/`, its files there as a store
/// of their own (a `PrefixStore`), its configuration an object in it
/// (`.ubiquity/container.json`) that syncs like any other. The store's root is the default
/// container, holding what a mount without `--container` shows.
public enum Containers {
    public static let root = ReservedKeys.root + "containers/"
    static let configName = ReservedKeys.root + "container.json"
    /// The user-visible scope of a container; the rest is its data.
    public static let documents = "Documents"

    public static func prefix(_ name: String) -> String { root + name + "/" }

    /// Names like iCloud's container ids: letters, digits, `.`, `-` and `_`, 1 to 128, not
    /// starting with a dot.
    public static func validate(name: String) throws {
        let ok = !name.isEmpty && name.utf8.count <= 128 && !name.hasPrefix(".")
            && name.allSatisfy { $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "." || $0 == "-" || $0 == "_") }
        if !ok { throw StoreError.failed("\(name.debugDescription) is not a container name: 1 to 128 letters, digits, '.', '-' or '_', not starting with '.'") }
    }

    public static func validate(folderLevels: String) throws {
        if !["none", "one", "any"].contains(folderLevels) {
            throw StoreError.failed("folder levels are none, one or any, not \(folderLevels.debugDescription)")
        }
    }

    /// Makes the container (its configuration); refused when one of that name exists.
    public static func create(_ config: ContainerConfig, in store: any CloudStore) async throws {
        try validate(name: config.name)
        try validate(folderLevels: config.folderLevels)
        let body = FileManager.default.temporaryDirectory.appendingPathComponent("ubiq-container-\(UUID().uuidString)")
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        try encoder.encode(config).write(to: body)
        defer { unlink(body.path) }
        do {
            _ = try await store.put(prefix(config.name) + configName, contentsOf: body,
                                    metadata: ObjectMetadata(kind: .file, mode: 0o644), condition: .ifAbsent)
        } catch StoreError.preconditionFailed {
            throw StoreError.failed("the store has a container named \(config.name) already")
        }
    }

    /// The container's configuration (nil: no such container).
    public static func config(_ name: String, in store: any CloudStore) async throws -> ContainerConfig? {
        try validate(name: name)
        let key = prefix(name) + configName
        let info: ObjectInfo
        do { info = try await store.head(key) } catch StoreError.notFound { return nil }
        let data = try await store.read(key, version: info.version, range: 0 ..< max(1, info.size))
        guard let c = try? JSONDecoder().decode(ContainerConfig.self, from: data) else {
            throw StoreError.failed("the configuration of container \(name) is unreadable")
        }
        return c
    }

    /// Every container of the store, by name.
    public static func list(in store: any CloudStore) async throws -> [ContainerConfig] {
        var out: [ContainerConfig] = []
        for o in try await store.list(prefix: root) where o.key.hasSuffix("/" + configName) {
            let name = String(o.key.dropFirst(root.count).dropLast(configName.count + 1))
            if (try? validate(name: name)) != nil, let c = try await config(name, in: store) { out.append(c) }
        }
        return out.sorted { $0.name < $1.name }
    }
}
