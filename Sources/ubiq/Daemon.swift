import Foundation
import Logging
import UbiqCoordinator
import UbiqControl
import UbiqFS
import UbiqFuse
import UbiqS3
import UbiqState
import UbiqStore
import UbiqSync

/// The mounted daemon: wires every layer together and owns the process.
struct Daemon {
    let plan: MountPlan
    let echo: Bool
    /// Report readiness (or the error) on standard output, for the parent `ubiq mount`.
    let notify: Bool

    func run() -> Never {
        FuseServer.blockTerminationSignals()
        let logger = openLog()
        guard let lockFD = StateLock.acquire(plan.stateDir) else {
            die("state directory \(plan.stateDir) is in use by another ubiq daemon (pid \(StateLock.holder(plan.stateDir) ?? -1))", logger)
        }
        if notify { setsid() }
        let opened: Opened
        do { opened = try openParts(logger) } catch { die("\(error)", logger) }
        let (store, state, cache) = (opened.store, opened.state, opened.cache)
        do { try bindScope(state, opened.containerConfig, logger) } catch { die("\(error)", logger) }
        let deviceID: String
        do { deviceID = try Self.deviceID(state) } catch { die("\(error)", logger) }
        // A device new to the store lists it before it mounts (its folders would be empty
        // otherwise), up to `Importer.beforeMount` objects; at a mount again, and a mount whose
        // listing failed here, the feed's first poll lists the store (`ChangeFeed.importFirst`),
        // which the mount waits for 2 s at most; so does a larger store's rest, which it does not wait for.
        let importer = Importer(store: store, state: state, cache: cache, logger: logger, deviceID: deviceID)
        var importedHere = false, importedPart = false
        do {
            try ChangeFeed.prepare(store: store, state: state)
            if !Importer.importedBefore(state) {
                importedHere = try importer.run(upTo: Importer.beforeMount).complete
                importedPart = !importedHere
            }
        } catch {
            logger.warning("could not list the store (\(error)); showing what this device knew, and listing it again in the background")
        }
        // A mount of a container's Documents only does not see the container's key-value store
        // (it is beside Documents): kv goes through a mount of the whole container.
        let kv: KVMirror? = plan.scope == "documents" ? nil
            : KVMirror(state: state, client: KVStoreClient(store: store, device: deviceID), logger: logger)
        let engine: Engine
        do {
            engine = try Engine(state: state, store: store, cache: cache, deviceID: deviceID, logger: logger,
                                options: engineOptions(deviceID), keyValues: kv)
        } catch { die("\(error)", logger) }
        kv?.pause = engine.pause
        if !importedHere { engine.feed.importFirst(importer) }
        if let depth = opened.containerConfig?.maxFolderDepth {
            engine.fs.folderLevels.withLock { $0 = FolderLevels(max: depth, under: plan.scope == "documents" ? nil : Containers.documents) }
        }
        let server = FuseServer(fs: engine.fs, options: plan.fuseOptions, logger: logger)
        do { try server.mount(at: plan.mountpoint, fsname: plan.fsname) } catch { die("\(error)", logger) }
        let running = Running(opened: opened, engine: engine, server: server, kv: kv, lockFD: lockFD, logger: logger,
                              registry: Paths.registry(for: plan.mountpoint))
        serve(running, deviceID: deviceID, waitForTheFirstLook: !importedHere && !importedPart)
        let status = server.run()
        shutDown(running, status: status)
    }

    /// The log (`<state>/ubiq.log`), the state folder closed to others first.
    private func openLog() -> Logger {
        // The state is the owner's alone, also in a folder that was there before (an fstab line's).
        var st = stat()
        if stat(plan.stateDir, &st) == 0 && st.st_uid == getuid() { chmod(plan.stateDir, 0o700) }
        let sink = FileLogHandler.Sink(path: plan.stateDir + "/ubiq.log", echo: echo)
        // Detached, standard error is the log too: a crash (a fatal error, a signal) says why
        // there, not to nobody.
        if notify { sink.stderrToo = true }
        return Logger(label: "ubiq") { label in FileLogHandler(sink: sink, label: label) }
    }

    /// Says why the daemon cannot go on, to the log and to the parent `ubiq mount`, and exits.
    private func die(_ message: String, _ logger: Logger) -> Never {
        logger.error("\(message)")
        if notify { say("error: \(message)") }
        fail(message)
    }

    /// What the daemon opens before it mounts.
    private struct Opened {
        let state: LocalState
        /// Wrapped as the plan and the environment ask (a container's prefix, a slow link, faults).
        let store: any CloudStore
        let faulty: FaultyStore?
        let containerConfig: ContainerConfig?
        let cache: ContentCache
    }

    private func openParts(_ logger: Logger) throws -> Opened {
        let cacheDir = URL(fileURLWithPath: plan.stateDir + "/cache")
        // A staging copy a crash left behind may be what filled the disk: gone first.
        ContentCache.clearStaging(in: cacheDir)
        let state = try LocalState(path: plan.stateDir + "/state.db", exclusive: true,
                                   report: { [logger] in logger.error("\($0)") })
        try bindStore(state, logger)
        let (base, containerConfig) = try openStore(state, logger)
        let (store, faulty) = wrapped(base, logger)
        state.reserve.restore()
        let cache = try ContentCache(directory: cacheDir, reserve: state.reserve)
        return Opened(state: state, store: store, faulty: faulty, containerConfig: containerConfig, cache: cache)
    }

    /// A state serves the store it was made with: on another, its pending edits would go there,
    /// and the other's files would read as this device's deletes (a dir: state on an S3 store
    /// was taken, and uploaded its files there).
    private func bindStore(_ state: LocalState, _ logger: Logger) throws {
        let address = plan.store.address
        let bound = try state.read { try $0.meta("store_address") }
        if let bound, bound != address {
            die("state directory \(plan.stateDir) belongs to \(bound), not \(address): mount \(address) with a new --state to start another device there", logger)
        }
        if bound == nil {
            // A state from before 2026-12-07 is not bound yet: a directory store's has its
            // store_id, an S3 device's its S3 index.
            let isFolder = plan.store.folder != nil
            let was = try state.read { try $0.meta("store_id") } != nil ? "a directory store (dir:)"
                : isFolder && FileManager.default.fileExists(atPath: plan.stateDir + "/s3-index.db") ? "an S3 store" : nil
            if let was, (was.hasPrefix("a directory")) != isFolder {
                die("state directory \(plan.stateDir) belongs to \(was), not \(address): mount \(address) with a new --state to start another device there", logger)
            }
            try state.write { try $0.setMeta("store_address", address) }
        }
    }

    /// The plan's store, and of a container the part under its folder (with its configuration).
    private func openStore(_ state: LocalState, _ logger: Logger) throws -> (any CloudStore, ContainerConfig?) {
        let opened = try MountPlan.openStore(plan.store, indexPath: plan.stateDir + "/s3-index.db", logger: logger,
                                             fullListingInterval: plan.fullListingInterval)
        let store = opened.store
        if let identity = opened.identity {
            // The store this device synced with, and no other made anew in its place.
            let known = try state.read { try $0.meta("store_id") }
            if let known, known != identity {
                die("the store at \(plan.store.folder ?? plan.storeURL) is not the one this device synced with (it was made anew or replaced); mount it with a new --state to start another device, and keep \(plan.stateDir) until its edits are recovered", logger)
            }
            if known == nil { try state.write { try $0.setMeta("store_id", identity) } }
        }
        if let q = plan.quota, let setQuota = opened.setQuota { try setQuota(q > 0 ? q : nil) }
        guard let name = plan.container else { return (store, nil) }
        let config: ContainerConfig
        do {
            guard let c = try runBlocking({ try await Containers.config(name, in: store) }) else {
                // The whole command, the S3 endpoint and region too (left out, it made the container elsewhere).
                let command = (["ubiq", "container", "create", name, "--store", plan.storeURL] + plan.store.daemonArguments).map(shellQuoted)
                die("the store has no container \(name): make it with \(command.joined(separator: " "))", logger)
            }
            config = c
        } catch let e as StoreError where e.isTransient {
            // Away: the configuration this device saw last (kept in its state).
            guard let saved = try? state.read({ try $0.meta("container_config") }),
                  let c = try? JSONDecoder().decode(ContainerConfig.self, from: Data(saved.utf8)) else { throw e }
            config = c
        }
        return (PrefixStore(store, prefix: Containers.prefix(name) + (plan.scope == "documents" ? Containers.documents + "/" : "")), config)
    }

    /// `store`, limited as the mount asks (`--bwlimit`), and slowed or made faulty where the
    /// environment asks, for tests and demonstrations (docs/testing.md).
    private func wrapped(_ base: any CloudStore, _ logger: Logger) -> (any CloudStore, FaultyStore?) {
        var store = base
        // The user's limit (`--bwlimit`), each way shared by every transfer.
        if let b = plan.bandwidth, b.up != nil || b.down != nil {
            store = ThrottledStore(store, bytesPerSecond: b.down.map(Double.init) ?? 1e15, writeBytesPerSecond: b.up.map(Double.init))
            logger.info("transfers are limited (--bwlimit): up \(b.up.map { humanBytes($0) + "/s" } ?? "no limit"), down \(b.down.map { humanBytes($0) + "/s" } ?? "no limit")")
        }
        // A slow link.
        let env = ProcessInfo.processInfo.environment
        let readRate = env["UBIQ_STORE_READ_RATE"].flatMap { MountPlan.parseSize($0) }
        let writeRate = env["UBIQ_STORE_WRITE_RATE"].flatMap { MountPlan.parseSize($0) }
        let latency = env["UBIQ_STORE_READ_LATENCY"].flatMap { Double($0) }.flatMap { $0 > 0 && $0 <= 600 ? $0 : nil }
        if readRate != nil || writeRate != nil || latency != nil {
            store = ThrottledStore(store, bytesPerSecond: readRate.map(Double.init) ?? 1e15,
                                   writeBytesPerSecond: writeRate.map(Double.init), readLatency: latency ?? 0)
            logger.info("the link to the store is slowed: reads \(readRate.map(String.init) ?? "-") bytes/s, writes \(writeRate.map(String.init) ?? "-") bytes/s, \(latency.map { "\($0)" } ?? "no") seconds before each read (UBIQ_STORE_READ_RATE, UBIQ_STORE_WRITE_RATE, UBIQ_STORE_READ_LATENCY)")
        }
        // A store that goes away while a file exists (for tests of offline work), and one
        // with random faults (latency, failures, lost answers, cut reads, timeouts).
        let flag = env["UBIQ_STORE_OFFLINE_FLAG"].flatMap { $0.isEmpty ? nil : $0 }
        let listGate = env["UBIQ_STORE_LIST_GATE"].flatMap { $0.isEmpty ? nil : $0 }
        var chaos: FaultyStore.Chaos?
        if let text = env["UBIQ_STORE_CHAOS"], !text.isEmpty {
            guard let c = FaultyStore.Chaos.parse(text) else {
                die("UBIQ_STORE_CHAOS: cannot read \(text.debugDescription) (e.g. seed=7,fail=0.1,lose=0.05,short=0.1,wrong=0.05,hang=0.01,timeout=2,latency=0-20)", logger)
            }
            chaos = c
        }
        guard flag != nil || chaos != nil || listGate != nil else { return (store, nil) }
        let faulty = FaultyStore(store, offlineFlag: flag, listGate: listGate, chaos: chaos)
        if let flag { logger.info("the store is unreachable while \(flag) exists (UBIQ_STORE_OFFLINE_FLAG)") }
        if let listGate { logger.info("listings of the whole store wait while \(listGate) exists (UBIQ_STORE_LIST_GATE)") }
        if let chaos { logger.info("the store injects random faults: \(chaos) (UBIQ_STORE_CHAOS)") }
        return (faulty, faulty)
    }

    /// A state directory serves one container and scope: another would see its files as deleted.
    private func bindScope(_ state: LocalState, _ containerConfig: ContainerConfig?, _ logger: Logger) throws {
        let scope = "\(plan.container ?? ""):\(plan.container == nil ? "all" : plan.scope)"
        let was = try state.read { try $0.meta("container_scope") }
        if let was, was != scope {
            die("state directory \(plan.stateDir) belongs to a mount of \(was.hasPrefix(":") ? "the store's root" : "container " + was.replacingOccurrences(of: ":", with: ", scope "))", logger)
        }
        try state.write { tx in
            try tx.setMeta("container_scope", scope)
            if let c = containerConfig, let d = try? JSONEncoder().encode(c) { try tx.setMeta("container_config", String(decoding: d, as: UTF8.self)) }
        }
    }

    /// This device's id, made at its first mount.
    private static func deviceID(_ state: LocalState) throws -> String {
        try state.write { tx in
            if let id = try tx.meta("device_id") { return id }
            let id = UUID().uuidString.lowercased()
            try tx.setMeta("device_id", id)
            return id
        }
    }

    /// The engine's options, from the plan and the environment.
    private func engineOptions(_ deviceID: String) -> Engine.Options {
        // The name conflict copies of this device's versions carry: the host, and enough of
        // the device's id to tell two mounts on one host apart.
        var options = Engine.Options(deviceName: ConflictName.deviceLabel(ProcessInfo.processInfo.hostName
            .split(separator: ".").first.map(String.init) ?? "host") + "-" + deviceID.prefix(4))
        if let chunks = plan.store.chunks { options.chunkSize = Int64(chunks.size); options.parallelism = chunks.parallel }
        options.readTimeout = plan.readTimeout
        options.uploadDelay = plan.uploadDelay
        options.transfers = plan.transfers
        options.pollInterval = plan.pollInterval
        options.hydration = plan.hydration
        options.cacheLimit = plan.cacheSize
        options.syncOnClose = plan.syncOnClose
        options.accessTimes = plan.accessTimes
        options.traceUploads = ProcessInfo.processInfo.environment["UBIQ_TRACE_UPLOADS"] == "1"
        if let w = ProcessInfo.processInfo.environment["UBIQ_SYNC_WAIT"].flatMap(Double.init), w.isFinite, w > 0, w <= 3600 {
            options.syncWait = w
        }
        return options
    }

    /// A mounted device's parts, from its start to its end.
    private final class Running {
        let opened: Opened
        let engine: Engine
        let server: FuseServer
        let kv: KVMirror?
        let lockFD: Int32
        let logger: Logger
        let registry: String
        var control: ControlServer?
        let heap: HeapRelease
        init(opened: Opened, engine: Engine, server: FuseServer, kv: KVMirror?, lockFD: Int32, logger: Logger, registry: String) {
            self.opened = opened; self.engine = engine; self.server = server; self.kv = kv; self.lockFD = lockFD
            self.logger = logger; self.registry = registry
            // What the import freed goes back to the system now, and what later work frees as it grows.
            heap = HeapRelease(report: { [logger] before, after, seconds in
                guard before - after >= 8 << 20 else { return }
                logger.info("gave \((before - after) >> 20) MiB of freed memory back to the system (resident now \(after >> 20) MiB; \(Int(seconds * 1000)) ms)")
            })
        }
    }

    /// Everything that runs beside the kernel's requests, started: the mount's record, the
    /// control socket, the uploader, the feed, the heap's release; then "ready" to the parent.
    private func serve(_ r: Running, deviceID: String, waitForTheFirstLook: Bool) {
        let (fs, feed, uploader, logger) = (r.engine.fs, r.engine.feed, r.engine.uploader, r.logger)
        let record = MountRecord(pid: getpid(), mountpoint: plan.mountpoint, state: plan.stateDir, store: plan.storeURL)
        try? FileManager.default.createDirectory(atPath: (r.registry as NSString).deletingLastPathComponent,
                                                 withIntermediateDirectories: true)
        try? JSONEncoder().encode(record).write(to: URL(fileURLWithPath: r.registry))
        let control = ControlServer(path: Self.controlSocketPath(plan), engine: r.engine, kv: r.kv,
                                    info: MountInfo(mount: plan.mountpoint, store: plan.storeURL, device: deviceID,
                                                    deviceName: uploader.deviceName, state: plan.stateDir,
                                                    cacheLimit: plan.cacheSize, pid: getpid()),
                                    logger: logger)
        r.control = control
        do {
            try control.start()
            fs.controlSocketPath.withLock { $0 = control.path }
        } catch {
            logger.warning("no control socket (\(error)): ubiq query, watch and sync will not reach this mount")
        }
        // Conflicts shown on the desktop, where there is one.
        _ = ConflictNotifier.start(events: fs.events, mount: plan.mountpoint, logger: logger)
        uploader.refreshUsage(force: true)
        uploader.start()
        feed.start()
        // A mount again shows the store as it is now when its first look takes a moment, and
        // what the device knew when it takes longer (docs/sync.md).
        if waitForTheFirstLook && !feed.waitForAPoll(seconds: Self.firstLookWait) {
            logger.info("the first look at the store takes more than \(Int(Self.firstLookWait)) s: the mount shows what this device knew meanwhile")
        }
        // The key-value store as the store holds it now (the feed brings later changes).
        if let kv = r.kv { Thread.detachNewThread { [store = r.opened.store] in
            guard let keys = try? runBlocking({ try await store.list(prefix: ReservedKeys.kv) }).map(\.key) else { return }
            kv.apply(objectKeys: keys, initial: true)
        } }
        r.heap.now()
        r.heap.start()
        logger.info("mounted \(plan.storeURL) at \(plan.mountpoint) (device \(deviceID), \(fs.inodeCount) items, cache limit \(plan.cacheSize) bytes)")
        logger.info(plan.syncOnClose ? "close(2) syncs what was written to disk (--sync-on-close)"
                                     : "close(2) commits what was written, safe from a killed daemon; fsync(2) syncs it to disk")
        if notify {
            say("ready")
            // From here on, nothing goes to the parent's pipe (standard error goes to the log).
            let null = open("/dev/null", O_RDWR)
            dup2(null, 1)
        }
        // A real crash on demand, for the test that its reason reaches the log (docs/testing.md).
        if let flag = ProcessInfo.processInfo.environment["UBIQ_TEST_CRASH_FLAG"], !flag.isEmpty {
            Thread.detachNewThread {
                while unlink(flag) != 0 { usleep(100_000) }
                fatalError("crash asked for by UBIQ_TEST_CRASH_FLAG")
            }
        }
    }

    /// The kernel's loop has ended (an unmount): everything stopped in order, what is pending
    /// uploaded (up to the drain timeout), what was written made durable, and the process ends.
    private func shutDown(_ r: Running, status: Int32) -> Never {
        let (fs, feed, uploader, materializer, logger) = (r.engine.fs, r.engine.feed, r.engine.uploader, r.engine.materializer, r.logger)
        logger.info("unmounting (loop ended with \(status))")
        if let stats = r.server.operationStats { logger.info("operation times: \(stats)") }
        logger.info("fetched \(materializer.bytesFetched) content bytes from the store in this run")
        if materializer.digestMismatches > 0 {
            logger.warning("\(materializer.digestMismatches) downloads thrown away in this run: their bytes did not match their digest")
        }
        r.heap.stop()
        feed.stop()
        r.control?.stop()
        // Reads still waiting for the store: their mount is gone.
        materializer.answerAllWaiting(SyncError.local("the mount is ending"))
        r.server.unmount()
        // A mount of this state from now on waits for this daemon to exit, not refuses.
        StateLock.markUnmounted(r.lockFD)
        materializer.saveAllProgress()
        do { try fs.commitPendingCreates() } catch { logger.error("could not write new files' rows: \(error)") }
        fs.writeAccessTimes()
        fs.waitForRecycling()
        uploader.stop()
        let timeout = Self.requestedDrainTimeout(plan)
        let pending = uploader.pendingCount
        // A store that does not answer (offline) is not waited for: what waits goes up at the
        // next mount, and the change log's entries with it (an unmount waited out its whole
        // timeout trying, then tried the log again).
        let paused = r.engine.pause.isPaused
        let answers = !paused && feed.storeAnswers()
        if pending > 0 && paused {
            logger.info("sync is paused: \(pending) changes not yet uploaded; they upload once it is resumed")
        } else if pending > 0 && !answers {
            logger.warning("the store does not answer: \(pending) changes not yet uploaded; they upload at the next mount")
        } else if pending > 0 {
            logger.info("uploading \(pending) pending changes (up to \(Int(timeout)) s)")
            if !uploader.drain(timeout: timeout) {
                logger.warning("\(uploader.pendingCount) changes not yet uploaded; they upload at the next mount")
            }
        }
        if answers { uploader.publishAll() }
        // What was only closed is made durable too: an unmounted drive holds nothing a power
        // loss could take.
        r.opened.cache.syncAll()
        r.opened.state.syncToDisk()
        if let faulty = r.opened.faulty {
            logger.info("faults injected in this run: \(faulty.faultsInjected.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", "))")
        }
        try? FileManager.default.removeItem(atPath: r.registry)
        try? FileManager.default.removeItem(atPath: plan.stateDir + "/unmount-request")
        logger.info("stopped")
        exit(0)
    }

    /// How long a mount again waits for its first look at the store before it answers.
    static let firstLookWait: TimeInterval = 2

    /// `<state>/control.sock`; where that is longer than a socket address may be (108 bytes),
    /// a private directory of the user's runtime directory (or /tmp) instead.
    static func controlSocketPath(_ plan: MountPlan) -> String {
        let preferred = plan.stateDir + "/control.sock"
        if preferred.utf8.count < 100 { return preferred }
        let runtime = Paths.xdg("XDG_RUNTIME_DIR") ?? "/tmp/ubiq-\(getuid())"
        mkdir(runtime, 0o700)
        // Only a directory of our own, closed to others (another user may have made /tmp/ubiq-UID).
        var st = stat()
        guard lstat(runtime, &st) == 0, st.st_uid == getuid(), (st.st_mode & S_IFMT) == S_IFDIR, st.st_mode & 0o077 == 0 else {
            return preferred  // too long: the server says why, and runs without a socket
        }
        return runtime + "/ubiq-" + String(Paths.mountID(plan.mountpoint).suffix(8)) + ".sock"
    }

    /// `ubiq unmount --timeout S` leaves its wish in the state directory.
    static func requestedDrainTimeout(_ plan: MountPlan) -> Double {
        if let s = try? String(contentsOfFile: plan.stateDir + "/unmount-request", encoding: .utf8),
           let t = Double(s.trimmingCharacters(in: .whitespacesAndNewlines)), secondsRefused(t, "--timeout", zero: true) == nil {
            return t
        }
        return plan.drainTimeout
    }
}

/// Writes a line straight to standard output (unbuffered: the parent is waiting for it).
func say(_ line: String) {
    let bytes = Array((line + "\n").utf8)
    _ = bytes.withUnsafeBytes { write(1, $0.baseAddress, $0.count) }
}

/// `word` as a shell reads it back: as it is when it needs no quoting, else in single quotes.
func shellQuoted(_ word: String) -> String {
    let plain = word.unicodeScalars.allSatisfy { CharacterSet.alphanumerics.contains($0) || "@%+=:,./_-".unicodeScalars.contains($0) }
    return plain && !word.isEmpty ? word : "'" + word.replacingOccurrences(of: "'", with: "'\\''") + "'"
}
