import Foundation
import Testing
import UbiqSync

/// Memory that passing work freed goes back to the system (docs/scale.md, "Memory").
@Suite struct HeapReleaseTests {
    /// Allocates `bytes` in small blocks (as an import's records are), keeps one block in
    /// `keepOneIn` (so what is freed lies between kept blocks, where glibc does not give it back
    /// by itself), frees the rest and returns the kept ones.
    func fragment(_ bytes: Int, block: Int = 64, keepOneIn: Int) -> [UnsafeMutableRawPointer] {
        var all: [UnsafeMutableRawPointer] = []
        all.reserveCapacity(bytes / block)
        for _ in 0 ..< bytes / block {
            let p = UnsafeMutableRawPointer.allocate(byteCount: block, alignment: 8)
            p.storeBytes(of: 0xAB, as: UInt8.self)  // touched: resident
            all.append(p)
        }
        var kept: [UnsafeMutableRawPointer] = []
        for (i, p) in all.enumerated() { if i % keepOneIn == 0 { kept.append(p) } else { p.deallocate() } }
        return kept
    }

    @Test func freedMemoryBetweenLiveBlocksGoesBackWhenTheResidentMemoryGrew() throws {
        // Large next to what the tests running beside this one allocate meanwhile.
        let size = 256 << 20
        let heap = HeapRelease(growth: 64 << 20)
        #expect(!heap.ifGrown())  // the first look only notes where memory stands
        let kept = fragment(size, keepOneIn: 1024)  // one block of 64 bytes every 64 KiB
        defer { for p in kept { p.deallocate() } }
        let before = try #require(HeapRelease.residentBytes())
        #expect(heap.ifGrown())
        let after = try #require(HeapRelease.residentBytes())
        // Fifteen pages in sixteen hold nothing live: at least half of the 256 MiB goes back.
        #expect(before - after >= Int64(size / 2), "resident \(before >> 20) MiB before, \(after >> 20) MiB after")
        // Nothing grew since: no second release.
        #expect(!heap.ifGrown())
    }
}
