import Foundation
import Testing

/// Two live mounts of one store: two devices, each seeing the other's changes while both
/// are mounted (the change feed), through the kernel's caches.
@Suite(.serialized) struct TwoDeviceTests {
    /// Runs `script` in `m` until it succeeds, up to `seconds` (the other device's upload and
    /// this one's next look at the store take a moment). Returns the last result.
    func eventually(_ m: MountFixture, _ script: String, seconds: Double = 20) -> ShellResult {
        let deadline = Date(timeIntervalSinceNow: seconds)
        var r = m.sh(script)
        while r.status != 0 && Date() < deadline {
            usleep(200_000)
            r = m.sh(script)
        }
        return r
    }

    @Test func changesOnOneMountAppearOnTheOther() throws {
        let a = try MountFixture(extra: "--upload-delay 0")
        defer { a.cleanup() }
        let b = try MountFixture(store: a.store, name: "device-b", extra: "--poll-interval 1")
        defer { b.cleanup() }
        // B looks at the directory first, so the kernel caches its answer ("nothing there").
        expectOK(b.sh("ls -la . > /dev/null; [ ! -e note ]"))
        expectOK(a.sh("echo first > note && mkdir -p dir && echo x > dir/gone && chmod 600 note"))
        expectOK(eventually(b, "[ \"$(cat note)\" = first ] && [ -f dir/gone ] && [ $(stat -c %a note) = 600 ]"), "additions")
        // B has the bytes (and the kernel its pages): an edit on A must still show.
        expectOK(b.sh("cat note > /dev/null"))
        expectOK(a.sh("echo second, longer > note && rm dir/gone"))
        expectOK(eventually(b, "[ \"$(cat note)\" = 'second, longer' ] && [ ! -e dir/gone ] && [ -z \"$(ls dir)\" ]"), "edit and delete")
        // And back the other way, at once with `ubiq sync`.
        expectOK(b.sh("echo from b > reply"))
        expectOK(eventually(a, "\(ubiqBinary) sync . > /dev/null && [ \"$(cat reply)\" = 'from b' ]"), "reply")
        #expect(a.sh("\(ubiqBinary) sync .").out.hasPrefix("synced "))
    }

    @Test func syncOutsideAMountIsAClearError() throws {
        let r = shell("\(ubiqBinary) sync /tmp")
        #expect(r.status != 0)
        #expect(r.err.contains("not in a ubiq mount"), "\(r.err)")
    }
}
