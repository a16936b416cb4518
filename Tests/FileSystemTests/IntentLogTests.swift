import Foundation
import Synchronization
import Testing
import TestSupport
import UbiqClock
@testable import UbiqState

/// Changes recorded in the state's intent log (`LocalState.record`) and applied to its database
/// later: read at once, kept by a process that dies before they were applied, and a log with a
/// torn, foreign or refused record loses only that record.
@Suite struct IntentLogTests {
    final class Reports: Sendable {
        let lines = Mutex<[String]>([])
        var sink: @Sendable (String) -> Void { { [self] s in lines.withLock { $0.append(s) } } }
        var all: String { lines.withLock { $0.joined(separator: "\n") } }
    }

    private func paths() throws -> String {
        let dir = TempPaths.make("ubiq-intents")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        return dir.appendingPathComponent("state.db").path
    }

    private func file(_ ino: UInt64, in parent: UInt64 = 1, named name: String) -> [StateChange] {
        let rec = InodeRecord(ino: ino, type: UInt32(S_IFREG), perm: 0o644, uid: 0, gid: 0, size: Int64(ino),
                              atimeNs: 1, mtimeNs: 2, ctimeNs: 3, target: nil)
        return [.upsert(rec), .insertEntry(parent: parent, name: Array(name.utf8), ino: ino), .enqueue(ino, notBefore: 0),
                .setXattr(ino, name: Array("user.k".utf8), value: [0, 255, 7])]
    }

    private func logSize(_ path: String) -> Int {
        (try? FileManager.default.attributesOfItem(atPath: path + "-intents")[.size] as? Int) ?? -1
    }

    /// A state opened and dropped without any transaction: what a killed daemon leaves.
    private func recordAndDie(_ path: String, _ batches: [[StateChange]]) throws {
        let s = try LocalState(path: path, applyDelay: 3600)
        for b in batches { try s.record(b) }
        #expect(s.hasRecorded)
    }

    @Test func recordedChangesAreReadAtOnceAndWrittenByTheNextTransaction() throws {
        let path = try paths()
        let s = try LocalState(path: path, applyDelay: 3600)
        try s.record(file(5, named: "a"))
        #expect(s.hasRecorded)
        #expect(logSize(path) > 0, "in the log when record returns")
        let (rec, entry, queued, xattrs) = try s.read { tx in
            (try tx.inode(5), try tx.entry(parent: 1, name: Array("a".utf8)), try tx.isQueued(5), try tx.xattrs(5))
        }
        #expect(rec?.size == 5 && entry?.ino == 5 && queued && xattrs[Array("user.k".utf8)] == [0, 255, 7])
        #expect(!s.hasRecorded, "a read applies them")
        // A transaction of its own sees them first and comes after them.
        try s.record([.removeEntry(parent: 1, name: Array("a".utf8)), .deleteInode(5)])
        let gone = try s.write { tx in try tx.inode(5) == nil && tx.entry(parent: 1, name: Array("a".utf8)) == nil }
        #expect(gone)
        // And one made for them once the delay has passed by the state's clock, with nothing
        // else asking.
        let time = ManualTime()
        let quick = try LocalState(path: try paths(), applyDelay: 0.05, time: time)
        try quick.record(file(9, named: "b"))
        time.advance(by: 0.04)
        #expect(quick.hasRecorded, "applied before the delay was over by the clock")
        time.advance(by: 0.02)  // the transaction made for them is over when this returns
        #expect(!quick.hasRecorded, "not applied once the delay was over by the clock")
    }

    @Test func changesAProcessDiedWithAreAppliedAtTheNextOpenOnce() throws {
        let path = try paths()
        try recordAndDie(path, [file(2, named: "a"), file(3, named: "b"), [.moveEntry(parent: 1, name: Array("a".utf8), toParent: 1, toName: Array("c".utf8))]])
        let reports = Reports()
        do {
            let s = try LocalState(path: path, applyDelay: 3600, report: reports.sink)
            #expect(!s.hasRecorded)
            #expect(logSize(path) == 0, "emptied once applied")
            let names = try s.read { tx in try tx.allEntries().map { String(decoding: $0.name, as: UTF8.self) }.sorted() }
            #expect(names == ["b", "c"])
            #expect(reports.all.isEmpty, "\(reports.all)")
            // Recorded after the recovery, then dies again: numbered on from the database's.
            try s.record(file(4, named: "d"))
            try s.record(file(6, named: "e"))
        }
        let again = try LocalState(path: path, applyDelay: 3600, report: reports.sink)
        let count = try again.read { tx in try tx.allInodes().count }
        #expect(count == 4, "2, 3, 4 and 6: \(count)")
        #expect(reports.all.isEmpty, "\(reports.all)")
    }

    @Test func aTornOrForeignTailLosesOnlyItself() throws {
        let path = try paths()
        try recordAndDie(path, [file(2, named: "a"), file(3, named: "b"), file(4, named: "c")])
        // The last record cut short (a power loss mid-write), then bytes of nothing.
        let size = logSize(path)
        #expect(truncate(path + "-intents", off_t(size - 3)) == 0)
        let h = try #require(FileHandle(forWritingAtPath: path + "-intents"))
        h.seekToEndOfFile()
        h.write(Data(repeating: 0xA5, count: 100))
        h.closeFile()
        do {
            let s = try LocalState(path: path, applyDelay: 3600)
            #expect(try s.read { tx in try tx.allInodes().map(\.ino).sorted() } == [2, 3])
        }
        // A record whose check fails, first in the log: nothing after it is trusted either.
        try recordAndDie(path, [file(7, named: "x")])
        var bytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: path + "-intents")))
        bytes[bytes.count - 1] ^= 1
        try Data(bytes).write(to: URL(fileURLWithPath: path + "-intents"))
        let t = try LocalState(path: path, applyDelay: 3600)
        #expect(try t.read { tx in try tx.inode(7) } == nil)
    }

    /// A log that does not follow on from the database (its start went with a power loss that
    /// kept a later part) is not applied: its changes were made on a state that is gone.
    @Test func aLogWithAGapIsNotApplied() throws {
        let path = try paths()
        _ = try LocalState(path: path)
        let h = try #require(FileHandle(forWritingAtPath: path + "-intents"))
        h.write(Data(IntentLog.record(seq: 5, changes: file(8, named: "late"))))
        h.closeFile()
        do {
            let reports = Reports()
            let s = try LocalState(path: path, applyDelay: 3600, report: reports.sink)
            #expect(try s.read { tx in try tx.inode(8) } == nil)
            #expect(reports.all.contains("skips from change 0 to 5"), "\(reports.all)")
            // Numbering goes on from the database's, so what is recorded now is applied next time.
            try s.record(file(9, named: "next"))
        }
        let t = try LocalState(path: path, applyDelay: 3600)
        #expect(try t.read { tx in try tx.inode(9) } != nil)
    }

    /// A second opening of the state (a test's device started again while the old one lives)
    /// applies the log; the first then does not apply the same changes again.
    @Test func changesAnotherOpeningAppliedAreNotAppliedTwice() throws {
        let path = try paths()
        let reports = Reports()
        let old = try LocalState(path: path, applyDelay: 3600, report: reports.sink)
        try old.record(file(2, named: "a"))
        let new = try LocalState(path: path, applyDelay: 3600, report: reports.sink)
        #expect(try new.read { tx in try tx.inode(2) } != nil)
        try old.applyRecordedNow()
        #expect(!old.hasRecorded)
        #expect(reports.all.isEmpty, "\(reports.all)")
        #expect(try old.read { tx in try tx.allEntries().count } == 1)
    }

    /// Past its limit the log starts again: empty when all of it is applied, else with only
    /// what is not (a change recorded while a transaction applied the others), so it does not
    /// grow through a burst; nothing is lost or applied twice either way.
    @Test func theLogStartsAgainPastItsLimitKeepingWhatIsNotApplied() throws {
        let path = try paths()
        do {
            let s = try LocalState(path: path, applyDelay: 3600, intentLogLimit: 1000)
            for i in 2 ..< 22 { try s.record(file(UInt64(i), named: "f\(i)")) }
            #expect(logSize(path) > 1000)
            try s.applyRecordedNow()
            #expect(logSize(path) == 0, "all applied: emptied")
            for i in 22 ..< 42 { try s.record(file(UInt64(i), named: "f\(i)")) }
            try s.write { _ in try s.record([.removeEntry(parent: 1, name: Array("f2".utf8)), .deleteInode(2)]) }
            let size = logSize(path)
            #expect(size > 0 && size < 100, "only the change recorded during the apply: \(size) bytes")
            #expect(s.hasRecorded)
        }
        let t = try LocalState(path: path, applyDelay: 3600)
        let (inodes, tombstones) = try t.read { tx in (try tx.allInodes().map(\.ino).sorted(), try tx.tombstoneKeys()) }
        #expect(inodes == Array(3 ..< 42), "\(inodes)")
        #expect(tombstones.isEmpty)
    }

    /// A change the database refuses (a bug: two entries of one name) is reported and left out;
    /// the changes after it, in its batch and in later ones, are applied.
    @Test func aRefusedChangeHoldsUpNothingAfterIt() throws {
        let path = try paths()
        let reports = Reports()
        let s = try LocalState(path: path, applyDelay: 3600, report: reports.sink)
        try s.record(file(2, named: "a"))
        try s.record([.insertEntry(parent: 1, name: Array("a".utf8), ino: 3), .enqueue(3, notBefore: 0)])
        try s.record(file(4, named: "b"))
        let (queued, inodes) = try s.read { tx in (try tx.isQueued(3), try tx.allInodes().map(\.ino).sorted()) }
        #expect(queued && inodes == [2, 4])
        #expect(reports.all.contains("refused"), "\(reports.all)")
    }

    /// Every kind of change comes back from the log's bytes as it was.
    @Test func everyChangeReadsBackFromItsBytes() throws {
        var rec = InodeRecord(ino: .max, type: UInt32(S_IFLNK), perm: 0o7777, uid: .max, gid: 7, size: -1, atimeNs: .min,
                              mtimeNs: .max, ctimeNs: 0, rdev: 1 << 40, target: Array("t\u{0}é".utf8), present: false,
                              contentGen: 3, metaGen: 4)
        rec.pinned = true
        let all: [StateChange] = [
            .upsert(rec), .deleteInode(9), .insertEntry(parent: 1, name: [0xFF, 0x2F], ino: 2),
            .removeEntry(parent: 3, name: []), .moveEntry(parent: 1, name: [1], toParent: 2, toName: [2, 3]),
            .exchangeEntries(1, [4], 2, [5]), .enqueue(7, notBefore: 1.5e9 + 0.25), .setXattr(1, name: [1], value: []),
            .removeXattr(2, name: [3]), .replaceXattrs(3, [[1]: [2], [3]: []]), .removeDownload(4),
        ]
        let path = try paths() + "-intents"
        try Data(IntentLog.record(seq: 1, changes: all)).write(to: URL(fileURLWithPath: path))
        let log = try IntentLog(path: path)
        let back = log.readAll()
        #expect(back.count == 1 && back.first?.seq == 1 && back.first?.changes == all)
    }
}
