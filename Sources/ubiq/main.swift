import Foundation

// A process started from a thread that blocks signals (a thread pool's, say) inherits that
// mask; commands that stream until interrupted must die on SIGTERM/SIGINT/SIGHUP all the
// same. (The daemon blocks them again in its own way: FuseServer.blockTerminationSignals.)
var unblocked = sigset_t()
sigemptyset(&unblocked)
for s in [SIGTERM, SIGINT, SIGHUP, SIGPIPE] { sigaddset(&unblocked, s) }
pthread_sigmask(SIG_UNBLOCK, &unblocked, nil)

// mount(8) and /etc/fstab call `ubiq SOURCE MOUNTPOINT -o OPTIONS` (through mount.fuse3):
// that is `ubiq mount`.
// `ubiq mount` takes its defaults from the config file (Config).
let given = Array(CommandLine.arguments.dropFirst())
let args = Config.apply(to: MountHelper.rewrite(given) ?? given)
Ubiq.main(args)
