/// The kernel's references to inodes that are not in memory, kept compactly: after `ls -lR`
/// of a million files the kernel holds a reference to each (until it is short of memory or
/// forgets), and most of those files' nodes have left memory (`Inodes.trim`).
///
/// A `[UInt64: UInt64]` costs about 34 bytes a count. Inode numbers are given in order, so
/// those held lie close together: here a page of 16 one-byte counts stands for 16 numbers in
/// a row (about 2.5 bytes a count when they are dense, about as much as the dictionary when
/// each page holds one), and a count of 255 or more is kept whole beside it.
struct HeldReferences {
    /// Sixteen counts, a byte each (0: none; 255: see `large`).
    private struct Page {
        var words: (UInt64, UInt64) = (0, 0)
        var isEmpty: Bool { words.0 == 0 && words.1 == 0 }
        subscript(i: Int) -> UInt8 {
            get { UInt8(truncatingIfNeeded: (i < 8 ? words.0 : words.1) >> UInt64(8 * (i & 7))) }
            set {
                let shift = UInt64(8 * (i & 7))
                let clear = ~(UInt64(0xff) << shift), put = UInt64(newValue) << shift
                if i < 8 { words.0 = words.0 & clear | put } else { words.1 = words.1 & clear | put }
            }
        }
    }

    private var pages: [UInt64: Page] = [:]
    private var large: [UInt64: UInt64] = [:]

    /// The count for `ino` (nil: none); setting nil or 0 drops it.
    subscript(ino: UInt64) -> UInt64? {
        get {
            guard let page = pages[ino >> 4] else { return nil }
            switch page[Int(ino & 15)] {
            case 0: return nil
            case 255: return large[ino]
            case let c: return UInt64(c)
            }
        }
        set {
            let count = newValue ?? 0
            let i = Int(ino & 15)
            var page = pages[ino >> 4] ?? Page()
            if count >= 255 || page[i] == 255 { large[ino] = count >= 255 ? count : nil }
            page[i] = UInt8(min(count, 255))
            pages[ino >> 4] = page.isEmpty ? nil : page
        }
    }

    /// Drops the count for `ino`, saying what it was.
    mutating func removeValue(forKey ino: UInt64) -> UInt64? {
        defer { self[ino] = nil }
        return self[ino]
    }
}
