import Foundation

/// Where two byte sequences part, or nil when they are the same: for `#expect(bytesDiffer(a, b)
/// == nil)` on large content. `#expect(a == b)` on megabytes that differ makes Swift Testing
/// compute their difference (a Myers diff) before it reports: a 3 MB mismatch held a
/// clean-clone run for many minutes at full CPU.
public func bytesDiffer<A: Collection, B: Collection>(_ a: A, _ b: B) -> String?
    where A.Element == UInt8, B.Element == UInt8 {
    var i = 0
    var ia = a.makeIterator(), ib = b.makeIterator()
    while true {
        switch (ia.next(), ib.next()) {
        case (nil, nil): return nil
        case let (x?, y?) where x == y: i += 1
        case let (x, y):
            return "\(a.count) bytes against \(b.count): they part at offset \(i) (\(x.map(String.init) ?? "end") against \(y.map(String.init) ?? "end"))"
        }
    }
}
