import Testing
import TestSupport
@testable import UbiqFS

/// The kernel's references kept without their nodes (`HeldReferences`) say what a dictionary
/// of the same counts would: neighbours in one page do not disturb each other, counts of 255
/// and more are kept whole, and a count dropped is gone.
@Suite struct HeldReferencesTests {
    @Test(arguments: [1, 2, 3]) func saysWhatADictionaryWould(seed: UInt64) {
        var rng = SplitMix(state: seed)
        var refs = HeldReferences()
        var model: [UInt64: UInt64] = [:]
        for step in 0 ..< 50_000 {
            // Dense numbers (pages shared) and a few far apart; counts small and large.
            let ino = rng.next() % 4 == 0 ? rng.next() : rng.next() % 2000 + 2
            switch rng.next() % 6 {
            case 0:
                #expect(refs.removeValue(forKey: ino) == model.removeValue(forKey: ino))
            case 1:
                let count = [254, 255, 256, 1 << 40][Int(rng.next() % 4)]
                refs[ino] = UInt64(count)
                model[ino] = UInt64(count)
            case 2:
                refs[ino] = 0
                model[ino] = nil
            default:
                let count = (model[ino] ?? 0) + rng.next() % 3
                refs[ino] = count
                model[ino] = count == 0 ? nil : count
            }
            #expect(refs[ino] == model[ino])
            if step % 10_000 == 0 { for (i, c) in model { #expect(refs[i] == c) } }
        }
        for (i, c) in model { #expect(refs[i] == c) }
        for i: UInt64 in 0 ..< 2100 where model[i] == nil { #expect(refs[i] == nil) }
    }
}
