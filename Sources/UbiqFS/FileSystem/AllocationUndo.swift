import Foundation
import CUbiq

/// What an allocating fallocate(2) of a cache file gives back when it fails. A disk may fail
/// such a call with ENOSPC after taking some of the space (ext4 does: the file keeps the blocks
/// it got, and a size up to where they reach); ubiq still shows the size it had, so nothing a
/// user can see or remove short of the whole file held them, and a fallocate larger than the
/// free space filled the disk. Taken before the call: the size, and the holes the range had
/// within it; a failure cuts the file back to that size (which also frees the blocks kept past
/// the end: ext4 truncates them even at the same size, other disks get them punched), and makes
/// each hole a hole again. The space is left as the call found it. (Bytes a failed ZERO_RANGE
/// zeroed stay zero, as on the disk itself: `FileSystem.fallocate` records them as a change.)
struct AllocationUndo {
    let fd: Int32
    let sizeBefore: Int64
    let start: Int64, end: Int64
    /// The range's holes within the old size; nil when there were more than `maxHoles` (they
    /// are not given back: the range past the old size, where a failed call takes the most, is).
    let holes: [Range<Int64>]?

    static let maxHoles = 4096

    /// Nil for a mode that allocates nothing (punching a hole, collapsing or inserting a range),
    /// or when the file's size cannot be read.
    init?(fd: Int32, mode: Int32, offset: Int64, length: Int64) {
        let allocating = FALLOC_FL_KEEP_SIZE | FALLOC_FL_ZERO_RANGE | FALLOC_FL_UNSHARE_RANGE
        guard mode & ~Int32(allocating) == 0 else { return nil }
        var st = stat()
        guard fstat(fd, &st) == 0 else { return nil }
        self.fd = fd
        sizeBefore = Int64(st.st_size)
        start = offset
        end = offset.addingReportingOverflow(length).overflow ? Int64.max : offset + length
        holes = Self.holes(fd, from: start, to: min(end, sizeBefore))
    }

    /// The holes of `fd` in `from ..< to`, or nil when more than `maxHoles`.
    static func holes(_ fd: Int32, from: Int64, to: Int64) -> [Range<Int64>]? {
        var found: [Range<Int64>] = []
        var at = from
        while at < to {
            let hole = Int64(lseek(fd, off_t(at), CUBIQ_SEEK_HOLE))
            if hole < 0 || hole >= to { break }
            let data = Int64(lseek(fd, off_t(hole), CUBIQ_SEEK_DATA))
            let holeEnd = data < 0 ? to : min(data, to)  // ENXIO: a hole to the end
            found.append(hole ..< holeEnd)
            if found.count > maxHoles { return nil }
            at = holeEnd
        }
        return found
    }

    /// Gives back what the failed call took. Each step is best effort: what fails stays as the
    /// disk left it (the file's bytes are never touched: only space past its old end, and holes
    /// it had, are freed; blocks kept past the end before the call go too).
    func giveBack() {
        var st = stat()
        if fstat(fd, &st) == 0 && Int64(st.st_size) >= sizeBefore { _ = ftruncate(fd, off_t(sizeBefore)) }
        let punch = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
        let past = max(start, sizeBefore)
        if end > past { _ = cubiq_fallocate(fd, Int32(punch), past, end - past) }
        for hole in holes ?? [] { _ = cubiq_fallocate(fd, Int32(punch), hole.lowerBound, hole.count64) }
    }
}

private extension Range where Bound == Int64 {
    var count64: Int64 { upperBound - lowerBound }
}
