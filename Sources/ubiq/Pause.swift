import ArgumentParser
import Foundation
import UbiqControl

struct Pause: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Pause sync: uploads and other devices' changes wait (a metered connection, a slow link).",
        discussion: prose("""
            What is opened is still downloaded. The pause is kept across a restart of the mount, \
            until ubiq resume, or for --for that long.

            Examples:
              ubiq pause ~/Ubiquity
              ubiq pause --for 2h ~/Ubiquity
            """))

    @Option(name: .customLong("for"), help: ArgumentHelp("For this long (30m, 2h, 1d); default: until ubiq resume.", valueName: "LENGTH"))
    var length: String?

    @Argument(help: "A path in a ubiq mount (the whole mount is paused).", completion: .file())
    var path: String

    func validate() throws {
        if let length, (lengthOfTime(length) ?? 0) <= 0 {
            throw ValidationError("cannot read --for \(length) as a length of time: use 30m, 2h, 1d")
        }
    }

    func run() throws {
        let c = ControlClient.connect(for: path)
        defer { c.connection.close() }
        do { _ = try c.connection.request(.pause(seconds: length.flatMap(lengthOfTime)), as: Done.self) } catch {
            fail("cannot pause \(c.mount): \(error)")
        }
        let until = getAttribute(c.mount, "user.ubiq.sync-paused") ?? ""
        let waiting = getAttribute(c.mount, "user.ubiq.items-uploading") ?? "0"
        print("sync of \(c.mount) paused " + (until == "indefinitely" ? "until ubiq resume" : "until \(until)")
              + "; \(waiting) changes wait to upload")
    }
}

struct Resume: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Resume sync paused by ubiq pause.",
        discussion: prose("""
            Example:
              ubiq resume ~/Ubiquity
            """))

    @Argument(help: "A path in a ubiq mount.", completion: .file())
    var path: String

    func run() throws {
        let c = ControlClient.connect(for: path)
        defer { c.connection.close() }
        do { _ = try c.connection.request(.resume, as: Done.self) } catch {
            fail("cannot resume \(c.mount): \(error)")
        }
        print("sync of \(c.mount) resumed")
    }
}
