import Testing
import TestSupport
@testable import UbiqFS

/// A folder's names (`FolderNames`) say what a dictionary of the same names would, through
/// any mix of adds, replacements and removals (its index moves entries on removal, and its
/// buffers are packed again as they empty).
@Suite struct FolderNamesTests {
    /// A random walk of operations against `[[UInt8]: UInt64]` as the model.
    @Test(arguments: [1, 2, 3, 4]) func saysWhatADictionaryWould(seed: UInt64) {
        var rng = SplitMix(state: seed)
        var names = FolderNames()
        var model: [[UInt8]: UInt64] = [:]
        // Few distinct names (many hits, collisions in small tables), long and empty ones too.
        func randomName() -> [UInt8] {
            let n = rng.next() % 3000
            switch n % 10 {
            case 0: return []
            case 1: return Array(repeating: UInt8(ascii: "x"), count: Int(n % 300))
            default: return Array("file-\(n).txt".utf8)
            }
        }
        for step in 0 ..< 60_000 {
            let name = randomName()
            // Phases: mostly adding, then mostly removing, so the table grows and shrinks.
            let removing = (step / 10_000) % 2 == 1
            if rng.next() % 10 < (removing ? 8 : 3) {
                names[name] = nil
                model[name] = nil
            } else {
                let ino = rng.next() % 1000 + 2
                names[name] = ino
                model[name] = ino
            }
            #expect(names[name] == model[name])
            if step % 5000 == 4999 { check(names, model) }
        }
        for name in model.keys { names[name] = nil }
        #expect(names.isEmpty && names.count == 0)
        #expect(Array(names).isEmpty)
    }

    /// A folder that grows to 100,000 names and empties again, as `rm -rf` of a big tree.
    @Test func aLargeFolderFillsAndEmpties() {
        var names = FolderNames()
        for i in 0 ..< 100_000 { names[Array("f\(i)".utf8)] = UInt64(i + 2) }
        #expect(names.count == 100_000)
        #expect(names[Array("f99999".utf8)] == 100_001)
        #expect(names[Array("f100000".utf8)] == nil)
        for i in stride(from: 0, to: 100_000, by: 2) { names[Array("f\(i)".utf8)] = nil }
        #expect(names.count == 50_000)
        let odd: [UInt64] = stride(from: 1, to: 100_000, by: 2).map { UInt64($0 + 2) }
        #expect(Set(names.values) == Set(odd))
        for i in stride(from: 1, to: 100_000, by: 2) {
            #expect(names[Array("f\(i)".utf8)] == UInt64(i + 2))
            names[Array("f\(i)".utf8)] = nil
        }
        #expect(names.isEmpty)
    }

    func check(_ names: FolderNames, _ model: [[UInt8]: UInt64]) {
        #expect(names.count == model.count)
        var seen: [[UInt8]: UInt64] = [:]
        for (name, ino) in names { seen[name] = ino }
        #expect(seen == model)
        #expect(names.values.sorted() == model.values.sorted())
        #expect(Set(names.keys) == Set(model.keys))
        for (name, ino) in model { #expect(names[name] == ino) }
    }
}
