import Foundation
import UbiqControl

/// The CLI's end of the control socket: a `ControlConnection` to the daemon of a mount,
/// failing with one clear line where a command cannot go on.
struct ControlClient {
    let mount: String
    let socketPath: String
    let connection: ControlConnection

    /// Connects to the daemon of the mount that `path` is in; fails with one clear line.
    static func connect(for path: String) -> ControlClient {
        let abs = Paths.absolute(path)
        guard FileManager.default.fileExists(atPath: abs) else { fail("\(path): no such file or directory") }
        guard let mount = Mounts.ubiqMount(containing: abs) else { fail("\(path) is not in a ubiq mount") }
        guard let sock = getAttribute(mount, "user.ubiq.control-socket"), !sock.isEmpty else {
            fail("the daemon of \(mount) does not answer (is it still running?)")
        }
        do {
            return ControlClient(mount: mount, socketPath: sock, connection: try ControlConnection.dial(sock))
        } catch {
            fail("cannot reach the daemon of \(mount) at \(sock): \(error)")
        }
    }

    /// The daemon of the ubiq mount point `mount`, or nil when it does not answer.
    static func reach(mount: String) -> ControlClient? {
        guard let sock = getAttribute(mount, "user.ubiq.control-socket"), !sock.isEmpty,
              let c = try? ControlConnection.dial(sock) else { return nil }
        return ControlClient(mount: mount, socketPath: sock, connection: c)
    }

    /// The path of `abs` below the mount ("" for the mount itself).
    func relative(_ abs: String) -> String {
        abs == mount ? "" : String(abs.dropFirst(mount == "/" ? 1 : mount.count + 1))
    }

    /// The answer to `req`; fails with the daemon's words when it refuses.
    func request<T: Decodable>(_ req: ControlRequest, as type: T.Type = T.self) -> T {
        do { return try connection.request(req, as: T.self) } catch {
            fail(error is ControlError ? "\(error)" : "the daemon of \(mount): \(error)")
        }
    }

    /// The answer to `req`, or nil when the daemon refused or closed the connection.
    func ask<T: Decodable>(_ req: ControlRequest, as type: T.Type = T.self) -> T? {
        try? connection.request(req, as: T.self)
    }

    /// The next line of a stream (nil when the daemon closed it).
    func next<T: Decodable>(_ type: T.Type) -> T? {
        do { return try connection.next(T.self, limit: 1 << 20) } catch { fail("\(error)") }
    }

    func close() { connection.close() }
}
