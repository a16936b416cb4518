import Foundation
import Testing
@testable import UbiqFS

/// The checks a daemon makes where the kernel does not (`PermissionRules`), each as ext4 answers
/// it for a user without capabilities: chmod(2), chown(2), utimensat(2), truncate(2), open(2),
/// path_resolution(7). `LocalDiskComparisonTests.aUsersOwnMountFollowsTheLocalDiskRules` asks
/// ext4 itself the same questions.
@Suite struct PermissionRulesTests {
    typealias R = PermissionRules
    static let me: UInt32 = 1501, myGroup: UInt32 = 1501, other: UInt32 = 1502, extra: UInt32 = 1503
    static let user = Credentials(uid: me, gid: myGroup, supplementary: { $0 == extra })
    static let root = Credentials(uid: 0, gid: 0)

    static func file(_ perm: UInt32, _ uid: UInt32 = me, _ gid: UInt32 = myGroup) -> R.Item {
        R.Item(mode: UInt32(S_IFREG) | perm, uid: uid, gid: gid)
    }
    static func folder(_ perm: UInt32, _ uid: UInt32 = me, _ gid: UInt32 = myGroup) -> R.Item {
        R.Item(mode: UInt32(S_IFDIR) | perm, uid: uid, gid: gid)
    }

    /// The failure `body` throws, as errno's name ("ok" if none).
    static func outcome(_ body: () throws -> Void) -> String {
        do { try body(); return "ok" } catch FSError.accessDenied { return "EACCES" } catch FSError.notPermitted {
            return "EPERM"
        } catch { return "\(error)" }
    }

    @Test func onlyTheCallersOwnClassCounts() {
        let u = Self.user
        // The owner gets the owner's bits, even where the others' would give more.
        #expect(!R.allows(R.read, Self.file(0o077), u))
        #expect(R.allows(R.read | R.write, Self.file(0o600), u))
        // A member of the group (primary or supplementary) the group's, the rest the others'.
        #expect(R.allows(R.write, Self.file(0o060, Self.other, Self.myGroup), u))
        #expect(R.allows(R.read, Self.file(0o040, Self.other, Self.extra), u))
        #expect(!R.allows(R.read, Self.file(0o704, Self.other, Self.extra), u))
        #expect(R.allows(R.read, Self.file(0o004, Self.other, Self.other), u))
        #expect(!R.allows(R.write, Self.file(0o664, Self.other, Self.other), u))
        // Folders: x to go through, w and x to add or remove.
        #expect(R.allows(R.exec, Self.folder(0o711, Self.other, Self.other), u))
        #expect(!R.allows(R.read, Self.folder(0o711, Self.other, Self.other), u))
        #expect(!R.allows(R.write | R.exec, Self.folder(0o555), u))
        // Root may do all but run a file with no x bit.
        #expect(R.allows(R.read | R.write, Self.file(0o000, Self.other, Self.other), Self.root))
        #expect(!R.allows(R.exec, Self.file(0o644), Self.root))
        #expect(R.allows(R.exec, Self.file(0o010), Self.root))
        #expect(R.allows(R.exec, Self.folder(0o000), Self.root))
    }

    /// The supplementary groups come from /proc: asked only when the group's bits and the
    /// others' differ, and never for the owner.
    @Test func theGroupsAreAskedOnlyWhenTheyDecide() {
        final class Count: @unchecked Sendable { var n = 0 }
        let asked = Count()
        let u = Credentials(uid: Self.me, gid: Self.myGroup) { _ in asked.n += 1; return false }
        _ = R.allows(R.read, Self.file(0o644, Self.other, Self.extra), u)
        _ = R.allows(R.read, Self.file(0o640, Self.me, Self.extra), u)
        #expect(asked.n == 0)
        #expect(!R.allows(R.read, Self.file(0o640, Self.other, Self.extra), u))
        #expect(asked.n == 1)
        // The primary group needs no question.
        #expect(R.allows(R.read, Self.file(0o640, Self.other, Self.myGroup), u))
        #expect(asked.n == 1)
    }

    /// unlink(2), rename(2): write and search on the folder; in a sticky folder, only the owner
    /// of the item or of the folder.
    @Test func aStickyFolderKeepsOthersFilesFromBeingRemoved() {
        func remove(_ victim: R.Item, _ folder: R.Item, _ who: Credentials = Self.user) -> String {
            Self.outcome { try R.removal(of: victim, from: folder, who) }
        }
        let sticky = Self.folder(0o1777, Self.other, Self.other)
        #expect(remove(Self.file(0o666, Self.other, Self.other), sticky) == "EPERM")
        #expect(remove(Self.file(0o600), sticky) == "ok")
        #expect(remove(Self.file(0o666, Self.other, Self.other), Self.folder(0o1777)) == "ok")
        #expect(remove(Self.file(0o666, Self.other, Self.other), Self.folder(0o777, Self.other, Self.other)) == "ok")
        #expect(remove(Self.file(0o600), Self.folder(0o755, Self.other, Self.other)) == "EACCES")
        #expect(remove(Self.file(0o600), Self.folder(0o555)) == "EACCES")
        #expect(remove(Self.file(0o666, Self.other, Self.other), sticky, Self.root) == "ok")
    }

    @Test func anOpenNeedsWhatItsFlagsSay() {
        #expect(R.forOpen(flags: O_RDONLY) == R.read)
        #expect(R.forOpen(flags: O_WRONLY) == R.write)
        #expect(R.forOpen(flags: O_RDWR) == R.read | R.write)
        #expect(R.forOpen(flags: O_RDONLY | O_TRUNC) == R.read | R.write)
        #expect(R.forOpen(flags: O_WRONLY | O_APPEND | O_CREAT) == R.write)
        #expect(R.forOpen(flags: O_RDONLY | R.fmodeExec) == R.read | R.exec)
    }

    @Test func attributeChangesFollowTheOwnerRules() {
        let u = Self.user
        func change(_ ch: AttributeChanges, _ item: R.Item, handle: Bool = false) -> String {
            Self.outcome { _ = try R.setattr(ch, of: item, throughHandle: handle, u) }
        }
        let mine = Self.file(0o644), theirs = Self.file(0o666, Self.other, Self.other)
        let theirsReadOnly = Self.file(0o644, Self.other, Self.other)
        // chown(2): only root gives a file away; the owner may name itself.
        #expect(change(AttributeChanges(uid: Self.other), mine) == "EPERM")
        #expect(change(AttributeChanges(uid: Self.me), mine) == "ok")
        #expect(change(AttributeChanges(uid: Self.other), theirs) == "EPERM")
        // The owner changes the group to one of its own.
        #expect(change(AttributeChanges(gid: Self.extra), mine) == "ok")
        #expect(change(AttributeChanges(gid: Self.myGroup), mine) == "ok")
        #expect(change(AttributeChanges(gid: Self.other), mine) == "EPERM")
        #expect(change(AttributeChanges(gid: Self.myGroup), theirs) == "EPERM")
        // chmod(2): the owner only.
        #expect(change(AttributeChanges(mode: 0o600), mine) == "ok")
        #expect(change(AttributeChanges(mode: 0o600), theirs) == "EPERM")
        // utimensat(2): times given, the owner only, even with write permission; both "now",
        // the owner or a caller with write permission.
        let now = AttributeChanges(atime: .now, mtime: .now)
        let given = AttributeChanges(atime: .at(1), mtime: .at(1))
        #expect(change(given, mine) == "ok")
        #expect(change(given, theirs) == "EPERM")
        #expect(change(now, theirs) == "ok")
        #expect(change(now, theirsReadOnly) == "EACCES")
        #expect(change(AttributeChanges(mtime: .now), theirs) == "EPERM")
        #expect(change(AttributeChanges(atime: .now, mtime: .at(1)), theirs) == "EPERM")
        // The kernel's own mtime at a flush comes through the writer's open file.
        #expect(change(AttributeChanges(mtime: .at(1)), theirs, handle: true) == "ok")
        // truncate(2): write permission; ftruncate(2) was checked when the file was opened.
        #expect(change(AttributeChanges(size: 0), theirs) == "ok")
        #expect(change(AttributeChanges(size: 0), theirsReadOnly) == "EACCES")
        #expect(change(AttributeChanges(size: 0), Self.file(0o444)) == "EACCES")
        #expect(change(AttributeChanges(size: 0), theirsReadOnly, handle: true) == "ok")
        // Root: everything.
        #expect(Self.outcome { _ = try R.setattr(AttributeChanges(mode: 0o4755, uid: 7, gid: 7), of: theirs, throughHandle: false, Self.root) } == "ok")
    }

    /// chmod(2): a setgid bit is dropped, not refused, when the caller is not in the file's group.
    @Test func setgidStaysOnlyForAMemberOfTheGroup() throws {
        let u = Self.user
        let sgid = UInt32(S_ISGID)
        let kept = try R.setattr(AttributeChanges(mode: 0o2755), of: Self.file(0o755, Self.me, Self.extra), throughHandle: false, u)
        #expect(kept.mode == 0o2755)
        let dropped = try R.setattr(AttributeChanges(mode: 0o2755), of: Self.file(0o755, Self.me, Self.other), throughHandle: false, u)
        #expect(dropped.mode == 0o2755 & ~sgid)
        // The group it is given in the same change is the one that counts.
        let both = try R.setattr(AttributeChanges(mode: 0o2755, gid: Self.myGroup), of: Self.file(0o755, Self.me, Self.other),
                                 throughHandle: false, u)
        #expect(both.mode == 0o2755)
    }

    @Test func userXattrsNeedReadOrWritePermissionTheOthersTheKernelsCheck() {
        #expect(R.forXattr(Array("user.k".utf8), write: false) == R.read)
        #expect(R.forXattr(Array("user.k".utf8), write: true) == R.write)
        #expect(R.forXattr(Array("user.ubiq.pin".utf8), write: true) == R.write)
        // security.* is read without a check and written as the security module says;
        // trusted.* is root's. The kernel decides both, with or without default_permissions.
        #expect(R.forXattr(Array("security.capability".utf8), write: false) == 0)
        #expect(R.forXattr(Array("security.selinux".utf8), write: true) == 0)
        #expect(R.forXattr(Array("trusted.k".utf8), write: true) == 0)
        #expect(R.forXattr(Array("username".utf8), write: false) == 0)
    }
}
