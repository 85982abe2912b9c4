//! Attaches every kernel tracepoint uvia knows, prints which this kernel
//! has, what an event costs, and how many of each a second of this machine
//! produces.
use uvia_trace::kernel::{syscall_ns, KernelTracer, Point};

fn main() {
    let only_syscalls = std::env::args().any(|a| a == "--syscalls");
    let points: &[Point] = if only_syscalls {
        &[Point::SysEnter, Point::SysExit]
    } else {
        &Point::ALL
    };
    let bare = syscall_ns();
    let mut t = match KernelTracer::open(points, 1 << 18) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    let watched = syscall_ns();
    t.unwatch(std::process::id()).unwrap();
    let filtered = syscall_ns();
    println!(
        "getppid: {bare:.0} ns bare, {filtered:.0} ns traced but not watched, {watched:.0} ns watched; event costs {:?}",
        t.costs()
    );
    for (p, why) in t.missing() {
        println!("missing {}: {why}", p.name());
    }
    std::thread::sleep(std::time::Duration::from_secs(1));
    let (ev, _) = t.take();
    for p in t.attached() {
        println!(
            "{:<24} {}",
            p.name(),
            ev.iter().filter(|e| e.point == *p).count()
        );
    }
}
