import ArgumentParser
import Foundation
import Logging
import UbiqStore
import UbiqSync

struct Container: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "container",
        abstract: "Make and list a store's containers: one document space per app.",
        discussion: prose("""
            A container is a folder of the store of its own (.ubiquity/containers/NAME/), mounted
            with ubiq mount --container NAME; its Documents folder is what people see
            (--scope documents), the rest is the app's data. Its configuration syncs like a file.

            Examples:
              ubiq container create com.example.notes --store dir:/srv/s --display-name Notes --folder-levels one
              ubiq container list --store dir:/srv/s --json
              ubiq mount --store dir:/srv/s --container com.example.notes --scope documents ~/Notes
            """),
        subcommands: [ContainerCreate.self, ContainerList.self])
}

/// A store named on the command line, opened directly.
struct StoreOptions: ParsableArguments {
    @Option(help: ArgumentHelp("The store: dir:PATH, PATH or s3://BUCKET/PREFIX.", valueName: "URL"), completion: .directory)
    var store: String

    @Option(help: ArgumentHelp("S3 service address for an s3:// store.", valueName: "URL"))
    var s3Endpoint: String?

    @Option(help: ArgumentHelp("S3 region for signing.", valueName: "REGION"))
    var s3Region: String?

    func open() -> any CloudStore {
        do { return try openStoreForCLI(store, s3Endpoint: s3Endpoint, s3Region: s3Region) } catch { fail("\(error)") }
    }
}

/// Opens a store for a command (not a mount): an existing embedded store, or an S3 one (its
/// index in a temporary file, removed at exit).
func openStoreForCLI(_ url: String, s3Endpoint: String?, s3Region: String?) throws -> any CloudStore {
    let spec = try MountPlan.parseStore(url, s3Endpoint: s3Endpoint, s3Region: s3Region)
    let logger = Logger(label: "ubiq-cli") { _ in SwiftLogNoOpLogHandler() }
    let index = FileManager.default.temporaryDirectory.appendingPathComponent("ubiq-cli-index-\(getpid()).db").path
    atexit { for s in ["", "-wal", "-shm"] { unlink(FileManager.default.temporaryDirectory.appendingPathComponent("ubiq-cli-index-\(getpid()).db").path + s) } }
    return try MountPlan.openStore(spec, indexPath: index, logger: logger, mustExist: true).store
}

struct ContainerCreate: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "create", abstract: "Make a container.")
    @OptionGroup var target: StoreOptions
    @Option(help: "The name people see (default: NAME).") var displayName: String?
    @Option(help: "How deep folders may go in Documents: none, one or any.", completion: .list(["none", "one", "any"])) var folderLevels = "any"
    @Flag(help: "Its Documents are for people to see (like iCloud Drive's app folders).") var publicDocuments = false
    @Argument(help: "Letters, digits, '.', '-', '_' (e.g. com.example.notes).") var name: String

    func run() throws {
        do {
            try Containers.validate(name: name)
            try Containers.validate(folderLevels: folderLevels)
        } catch { fail("\(error)".replacingOccurrences(of: "store error: ", with: "")) }
        let store = target.open()
        let config = ContainerConfig(name: name, displayName: displayName ?? name, folderLevels: folderLevels,
                                     publicDocuments: publicDocuments)
        do { try runBlocking { try await Containers.create(config, in: store) } } catch {
            fail("\(error)".replacingOccurrences(of: "store error: ", with: ""))
        }
        print("made container \(name)")
    }
}

struct ContainerList: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "list", abstract: "List the store's containers.")
    @OptionGroup var target: StoreOptions
    @Flag(help: "One JSON object per line.") var json = false

    func run() throws {
        let store = target.open()
        let all: [ContainerConfig]
        do { all = try runBlocking { try await Containers.list(in: store) } } catch { fail("\(error)") }
        for c in all {
            if json {
                let o: [String: Any] = ["name": c.name, "displayName": c.displayName, "folderLevels": c.folderLevels,
                                        "publicDocuments": c.publicDocuments]
                if let d = try? JSONSerialization.data(withJSONObject: o, options: [.sortedKeys]) { print(String(decoding: d, as: UTF8.self)) }
            } else {
                print("\(c.name)\t\(c.displayName)\tfolders: \(c.folderLevels)\(c.publicDocuments ? "\tpublic documents" : "")")
            }
        }
    }
}
