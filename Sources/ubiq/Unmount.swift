import ArgumentParser
import Foundation
import UbiqClock
import UbiqControl
import UbiqState

struct Unmount: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Unmount, after uploading pending changes (bounded wait).",
        discussion: prose("""
            Changes not uploaded within the timeout stay queued and upload at the next mount.
            A store that does not answer is asked once, not waited for.

            Examples:
              ubiq unmount ~/Ubiquity
              ubiq unmount --timeout 0 ~/Ubiquity     unmount now, upload later
            """))

    @Option(help: "Seconds to wait for pending uploads (default: the mount's --drain-timeout).")
    var timeout: Double?

    @Argument(help: "The mount point.", completion: .directory)
    var mountpoint: String

    func validate() throws {
        if let timeout, let refused = secondsRefused(timeout, "--timeout", zero: true) { throw ValidationError(refused) }
    }

    func run() throws {
        let mp = Paths.absolute(mountpoint)
        guard let entry = Mounts.entry(at: mp) else { fail("\(mp) is not mounted") }
        guard entry.type == "fuse.ubiq" else { fail("\(mp) is not a ubiq mount (\(entry.type))") }
        // The daemon's registry file is under the XDG_STATE_HOME it was started with; when this
        // command does not find it there (another environment, sudo), the daemon is asked.
        let registered = Mounts.record(for: mp).flatMap { Mounts.isRunning($0) ? $0 : nil }
        guard let rec = registered ?? Self.askDaemon(mp), Mounts.isRunning(rec) else {
            // The daemon is gone (killed): only the kernel's mount is left.
            if Mounts.fusermount(["-u", "-z", mp]) || umount2(mp, Int32(MNT_DETACH)) == 0 {
                print("Unmounted \(mp) (its daemon had stopped; pending changes upload at the next mount).")
                return
            }
            fail("cannot unmount \(mp)")
        }
        if let timeout {
            try? String(timeout).write(toFile: rec.state + "/unmount-request", atomically: true, encoding: .utf8)
        }
        kill(rec.pid, SIGTERM)
        let wait = (timeout ?? 30) + 30
        let deadline = Deadline(in: wait)
        while Mounts.isRunning(rec) && !deadline.passed { usleep(50_000) }
        if Mounts.isRunning(rec) { fail("the daemon (pid \(rec.pid)) did not stop within \(Int(wait)) s") }
        if Mounts.entry(at: mp) != nil { _ = Mounts.fusermount(["-u", mp]) }
        let counts: (Int, Int)
        do {
            counts = try LocalState(path: rec.state + "/state.db").read { tx in (try tx.outboxCount(), try tx.uploadErrorCount()) }
        } catch {
            // Never "all in the store" without having looked.
            print("Unmounted \(mp). Could not tell whether all changes are in the store: \(error).")
            return
        }
        let (pending, failed) = counts
        var message = "Unmounted \(mp)."
        if pending == 0 && failed == 0 { message += " All changes are in the store." }
        if pending > 0 { message += " \(pending) changes not yet uploaded; they upload at the next mount." }
        if failed > 0 {
            message += " \(failed) items could not be uploaded and are kept on this device only (see \(rec.state)/ubiq.log)."
        }
        print(message)
    }

    /// The daemon of `mp` as it describes itself over its control socket.
    static func askDaemon(_ mp: String) -> MountRecord? {
        guard let c = ControlClient.reach(mount: mp) else { return nil }
        defer { c.close() }
        guard let o = c.ask(.status, as: StatusReply.self), let pid = Int32(o.pid) else { return nil }
        return MountRecord(pid: pid, mountpoint: mp, state: o.state, store: o.store)
    }
}
