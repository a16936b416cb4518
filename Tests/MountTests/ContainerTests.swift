import Foundation
import Testing

/// Containers: made and listed with `ubiq container`, mounted with `--container`, kept apart,
/// their folder levels enforced through real mounts, `--scope documents` showing Documents only.
@Suite struct ContainerTests {
    @Test func containersAreMadeListedAndKeptApart() throws {
        let root = try MountFixture()
        defer { root.cleanup() }
        let store = "--store dir:\(root.store)"
        expectOK(root.ubiq("container create \(store) --display-name Notes --folder-levels one com.example.notes"))
        expectOK(root.ubiq("container create \(store) com.example.photos"))
        let again = root.ubiq("container create \(store) com.example.notes")
        #expect(again.status == 1 && again.err.contains("already"), "\(again.err)")
        for (bad, says) in [(".hidden", "not a container name"), ("a/b", "not a container name")] {
            let r = root.ubiq("container create \(store) '\(bad)'")
            #expect(r.status == 1 && r.err.contains(says), "\(bad): \(r.err)")
        }
        let levels = root.ubiq("container create \(store) --folder-levels two x")
        #expect(levels.status == 1 && levels.err.contains("none, one or any"), "\(levels.err)")
        #expect(root.ubiq("container list \(store)").out
            == "com.example.notes\tNotes\tfolders: one\ncom.example.photos\tcom.example.photos\tfolders: any\n")
        #expect(root.ubiq("container list --json \(store)").out.contains("\"folderLevels\":\"one\""))

        let notes = try MountFixture(store: root.store, name: "notes", extra: "--container com.example.notes --upload-delay 0")
        defer { notes.cleanup() }
        let photos = try MountFixture(store: root.store, name: "photos", extra: "--container com.example.photos --poll-interval 1")
        defer { photos.cleanup() }
        expectOK(notes.sh("mkdir -p Documents/trip data/cache/deep/er && echo n > Documents/trip/plan.txt && \(ubiqBinary) sync ."))
        expectOK(photos.sh("echo p > photo.txt && \(ubiqBinary) sync ."))
        // Each sees its own only; the store's root sees neither (nor the containers' folder).
        expectOK(photos.sh("\(ubiqBinary) sync . && test \"$(ls -A)\" = photo.txt"), "photos sees notes' files")
        expectOK(root.sh("\(ubiqBinary) sync . && test -z \"$(ls -A)\""), "the root sees containers' files")
        expectOK(notes.sh("test ! -e photo.txt && test -f Documents/trip/plan.txt"))

        // A second device of the notes container gets its files, and its folder levels.
        let docs = try MountFixture(store: root.store, name: "docs", extra: "--container com.example.notes --scope documents")
        #expect(docs.mountSaid.hasPrefix("Mounted container com.example.notes (its Documents) of dir:\(root.store) at "), "\(docs.mountSaid)")
        defer { docs.cleanup() }
        expectOK(docs.sh("test \"$(cat trip/plan.txt)\" = n && test \"$(ls -A)\" = trip"), "the documents scope")
        let deep = docs.sh("mkdir trip/deeper")
        #expect(deep.status != 0 && deep.err.contains("Operation not permitted"), "\(deep.err)")
        expectOK(docs.sh("mkdir second && echo x > trip/file"), "one level is allowed")
        let inNotes = notes.sh("mkdir Documents/trip/deeper")
        #expect(inNotes.status != 0, "a second level in Documents was allowed")
        expectOK(notes.sh("mkdir -p data/a/b/c"), "the data scope has no levels")
        let moved = notes.sh("mkdir Documents/other && mv data/a Documents/trip/")
        #expect(moved.status != 0, "a folder moved below the levels")
        let log = (try? String(contentsOfFile: notes.state + "/ubiq.log", encoding: .utf8)) ?? ""
        #expect(log.contains("refused folder Documents/trip/deeper: this container allows 1 folder level in Documents"))

        // Each container has a key-value store of its own.
        expectOK(notes.sh("\(ubiqBinary) kv set theme notes-dark"))
        expectOK(root.sh("\(ubiqBinary) kv set theme root-light"))
        #expect(root.ubiq("kv get \(store) --container com.example.notes theme").out == "notes-dark\n")
        #expect(root.ubiq("kv get \(store) theme").out == "root-light\n")
        #expect(root.ubiq("kv get \(store) --container com.example.photos theme").status == 1)
        let viaDocs = docs.sh("\(ubiqBinary) kv get theme")
        #expect(viaDocs.status == 1 && viaDocs.err.contains("Documents only"), "\(viaDocs.err)")
    }

    @Test func wrongContainerUseIsAClearError() throws {
        let m = try MountFixture()
        defer { m.cleanup() }
        expectOK(shell("mkdir -p \(m.base)/free"))
        let missing = m.ubiq("mount --store dir:\(m.store) --container com.example.none --state \(m.base)/st1 \(m.base)/free")
        #expect(missing.status == 1 && missing.err.contains("no container com.example.none"), "\(missing.err)")
        #expect(!FileManager.default.fileExists(atPath: m.base + "/st1"), "the failed mount left its state directory")
        let scope = m.ubiq("mount --store dir:\(m.store) --scope documents --state \(m.base)/st2 \(m.base)/free")
        #expect(scope.status == 1 && scope.err.contains("--scope applies to a container"), "\(scope.err)")
        expectOK(m.ubiq("container create --store dir:\(m.store) com.example.one"))
        // The root mount's state directory cannot serve a container.
        expectOK(m.unmount())
        let other = m.ubiq("mount --store dir:\(m.store) --container com.example.one --state \(m.state) \(m.mnt)")
        #expect(other.status == 1 && other.err.contains("belongs to a mount of the store's root"), "\(other.err)")
    }
}
