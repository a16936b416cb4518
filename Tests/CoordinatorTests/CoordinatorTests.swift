import Foundation
import Testing
import TestSupport
import UbiqClock
@testable import UbiqCoordinator

/// Tracks who holds what, independently of the Coordinator, and records any
/// moment where the rules were broken.
final class ReferenceModel: @unchecked Sendable {
    private let lock = NSLock()
    private var readers: [UInt64: Int] = [:]
    private var writers: [UInt64: Int] = [:]
    private(set) var violations: [String] = []

    func enter(_ items: [UInt64], _ intent: Intent) {
        lock.lock(); defer { lock.unlock() }
        for i in items {
            if intent.isShared {
                if writers[i, default: 0] > 0 { violations.append("reader entered \(i) while a writer held it") }
                readers[i, default: 0] += 1
            } else {
                if writers[i, default: 0] > 0 || readers[i, default: 0] > 0 {
                    violations.append("writer entered \(i) while held (r=\(readers[i, default: 0]) w=\(writers[i, default: 0]))")
                }
                writers[i, default: 0] += 1
            }
        }
    }

    func leave(_ items: [UInt64], _ intent: Intent) {
        lock.lock(); defer { lock.unlock() }
        for i in items {
            if intent.isShared { readers[i, default: 0] -= 1 } else { writers[i, default: 0] -= 1 }
        }
    }
}

/// A value shared between test threads, behind a lock.
final class Shared<T>: @unchecked Sendable {
    private let lock = NSLock()
    private var value: T
    init(_ v: T) { value = v }
    func with<R>(_ body: (inout T) -> R) -> R { lock.lock(); defer { lock.unlock() }; return body(&value) }
    var get: T { with { $0 } }
}

@Suite struct CoordinatorTests {
    @Test func sharedIntentsCoexist() throws {
        let c = Coordinator(defaultTimeout: 1)
        let a = try c.claim(7, .read)
        let b = try c.claim(7, .upload)
        c.release(a)
        c.release(b)
        #expect(c.activeItemCount == 0)
    }

    @Test func exclusiveExcludesAndTimesOut() throws {
        let c = Coordinator(defaultTimeout: 1)
        let w = try c.claim(7, .write)
        #expect(throws: CoordinatorError.timedOut(item: 7, intent: .read)) { try c.claim(7, .read, timeout: 0.05) }
        #expect(throws: CoordinatorError.timedOut(item: 7, intent: .delete)) { try c.claim([3, 7], .delete, timeout: 0.05) }
        // The failed multi-claim released item 3: it can be had now.
        let other = try c.claim(3, .write, timeout: 0.05)
        c.release(other)
        c.release(w)
        #expect(c.activeItemCount == 0)
    }

    /// A claim's deadline goes by the coordinator's clock: behind a writer, a claim with 30 s
    /// to wait is still waiting when the clock has moved 29 s, and gives up, holding nothing,
    /// as soon as it has moved past 30 s, whatever the real time.
    @Test func aClaimGivesUpWhenItsClockSaysSo() throws {
        let time = ManualTime()
        let c = Coordinator(defaultTimeout: 30, time: time)
        let w = try c.claim(7, .write)
        let outcome = Shared<Result<Bool, CoordinatorError>?>(nil)
        let ended = DispatchSemaphore(value: 0)
        Thread {
            do {
                let r = try c.claim([3, 7], .delete)
                c.release(r)
                outcome.with { $0 = .success(true) }
            } catch let e as CoordinatorError {
                outcome.with { $0 = .failure(e) }
            } catch {}
            ended.signal()
        }.start()
        waitUntil(seconds: 10) { c.waitingClaimCount != 0 }
        #expect(c.waitingClaimCount == 1, "the claim never waited")
        time.advance(by: 29)
        #expect(ended.wait(timeout: .now() + 0.3) == .timedOut, "gave up before its deadline")
        time.advance(by: 2)
        #expect(ended.wait(timeout: .now() + 10) == .success, "still waiting past its deadline")
        #expect(outcome.get == .failure(.timedOut(item: 7, intent: .delete)))
        // It held nothing: item 3 is free, and only the writer's item is claimed.
        #expect(c.activeItemCount == 1)
        c.release(w)
        #expect(c.activeItemCount == 0)
    }

    @Test func waitingWriterHoldsBackNewReaders() throws {
        let c = Coordinator(defaultTimeout: 5)
        let r1 = try c.claim(1, .read)
        let writerDone = Shared(false)
        let t = Thread {
            let w = try! c.claim(1, .write)
            writerDone.with { $0 = true }
            c.release(w)
        }
        t.start()
        waitUntil(seconds: 5) { c.waitingClaimCount != 0 }
        // A writer is waiting: a new reader must not overtake it forever.
        #expect(throws: CoordinatorError.self) { try c.claim(1, .read, timeout: 0.1) }
        c.release(r1)
        waitUntil(seconds: 5) { writerDone.get }
        #expect(writerDone.get)
    }

    @Test func moveClaimsBothSidesInOneOrder() throws {
        let c = Coordinator(defaultTimeout: 2)
        let m = try c.claim([9, 2], .move)
        #expect(m.items == [2, 9])
        #expect(throws: CoordinatorError.self) { try c.claim(9, .read, timeout: 0.05) }
        #expect(throws: CoordinatorError.self) { try c.claim(2, .read, timeout: 0.05) }
        c.release(m)
    }

    /// Many threads take random multi-item claims with random intents.
    /// The reference model must see no rule broken, every thread must
    /// finish (no deadlock) and make progress (no starvation).
    @Test func randomClaimsAgainstReferenceModel() throws {
        let c = Coordinator(defaultTimeout: 10)
        let model = ReferenceModel()
        let threads = 12
        let rounds = 400
        let progress = Shared([Int](repeating: 0, count: threads))
        let group = DispatchGroup()
        let failures = Shared([String]())
        for t in 0 ..< threads {
            group.enter()
            let th = Thread {
                var rng = SystemRandomNumberGenerator()
                for _ in 0 ..< rounds {
                    let n = Int.random(in: 1 ... 3, using: &rng)
                    let items = (0 ..< n).map { _ in UInt64.random(in: 0 ..< 6, using: &rng) }
                    let intent = Intent.allCases.randomElement(using: &rng)!
                    do {
                        let claim = try c.claim(items, intent)
                        model.enter(claim.items, intent)
                        if Bool.random(using: &rng) { usleep(UInt32.random(in: 0 ..< 200, using: &rng)) }
                        model.leave(claim.items, intent)
                        c.release(claim)
                        progress.with { $0[t] += 1 }
                    } catch {
                        failures.with { $0.append("thread \(t): \(error)") }
                    }
                }
                group.leave()
            }
            th.start()
        }
        // Watchdog: all rounds of all threads must finish well within the claim timeout.
        let finished = group.wait(timeout: .now() + 60) == .success
        #expect(finished, "deadlock: threads still waiting after 60 s")
        #expect(failures.get.isEmpty, "claims timed out (starvation): \(failures.get.prefix(3))")
        #expect(model.violations.isEmpty, "\(model.violations.prefix(3))")
        for t in 0 ..< threads { #expect(progress.get[t] == rounds, "thread \(t) made \(progress.get[t]) of \(rounds)") }
        #expect(c.activeItemCount == 0)
    }
}
