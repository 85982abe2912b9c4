//! The provider itself: the `fi_provider` libfabric finds through
//! `fi_prov_ini`, and the `FI_UVIA_*` parameters.
//!
//! The parameters are defined with libfabric's own `fi_param_define`, so
//! `fi_info -e` lists them, and read with `fi_param_get` (from the
//! environment today, wherever libfabric reads them tomorrow) once, when
//! first needed.

use crate::guard;
use crate::sys::*;
use std::cell::UnsafeCell;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;
use std::time::Duration;
use uvia::Reliability;

/// The provider's name, as libfabric programs ask for it (`-p uvia`).
pub const NAME: &CStr = c"uvia";

/// The newest libfabric interface whose calls the provider implements; a
/// program asking for a newer one skips it (libfabric 2.x programs ask for
/// their headers' version).
///
/// The provider is built against 1.17's headers and runs under 1.17 to
/// 2.5 alike: 2.x kept every ops table it fills as it was (what 2.x added
/// to them is behind `FI_CHECK_OP` sizes, or in the AV, which it has not);
/// its `fi_dupinfo` (1.x's, `fi_dupinfo@FABRIC_1.3`) returns a 2.x
/// `fi_info` whose new domain fields are zero (no auth keys, groups or
/// counters: what the provider has); hints and the structs 2.x grew at
/// their ends (`fi_domain_attr`, `fi_mr_attr`, `fi_cq_err_entry`) are read
/// and written as far as 1.17 has them.
pub const FI_VERSION_IMPLEMENTED: u32 = version(2, 5);

/// The provider's own version: the crate's major and minor.
pub const VERSION: u32 = version(0, 1);

/// The `fi_provider` libfabric holds. libfabric writes into its `context`
/// (its own bookkeeping), so it lives in an `UnsafeCell`.
pub struct Provider(UnsafeCell<fi_provider>);

// SAFETY: after fi_prov_ini hands it out only libfabric touches the cell
// (its context field, under libfabric's own initialisation lock); the
// provider reads the constant fields.
unsafe impl Sync for Provider {}

pub static PROVIDER: Provider = Provider(UnsafeCell::new(fi_provider {
    version: VERSION,
    fi_version: FI_VERSION_IMPLEMENTED,
    context: fi_context {
        internal: [std::ptr::null_mut(); 4],
    },
    name: NAME.as_ptr(),
    getinfo: Some(crate::info::getinfo),
    fabric: Some(crate::fabric::open),
    cleanup: Some(cleanup),
}));

impl Provider {
    pub fn as_ptr(&self) -> *mut fi_provider {
        self.0.get()
    }
}

/// libfabric's entry point: called once when it loads the library.
#[no_mangle]
pub extern "C" fn fi_prov_ini() -> *mut fi_provider {
    // Only libfabric's loader calls this, in the library's own copy of the
    // standard library (the Rust tests link the crate and never call it).
    guard::every_panic_is_guarded();
    guard::catch("fi_prov_ini", || {
        stay_loaded();
        define_params();
        PROVIDER.as_ptr()
    })
    .unwrap_or(std::ptr::null_mut())
}

/// Keeps this library mapped until the process ends. libfabric unloads
/// its providers (`dlclose`) when the program exits, while threads of
/// ours may still run: the thread that keeps closing connections alive
/// until their peers have the disconnect, a domain's drive thread. One of
/// them waking after the unload ran into unmapped code (a segfault as
/// `fi_pingpong` on udp exited, about one run in five of 50,000 round
/// trips). A second reference to the library marked `RTLD_NODELETE` leaves
/// libfabric's `dlclose` dropping its own and the mapping in place; the
/// threads then end with the process.
fn stay_loaded() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: dladdr fills `info` for an address in this library; its
        // name is a C string the loader owns for as long as the library is
        // loaded, which is while we call dlopen.
        unsafe {
            let mut info: libc::Dl_info = std::mem::zeroed();
            if libc::dladdr(stay_loaded as *const c_void, &mut info) != 0
                && !info.dli_fname.is_null()
            {
                // The handle is never closed: that is the point.
                libc::dlopen(
                    info.dli_fname,
                    libc::RTLD_NOW | libc::RTLD_NOLOAD | libc::RTLD_NODELETE,
                );
            }
        }
    });
}

unsafe extern "C" fn cleanup() {
    // Objects are freed when the program closes them; nothing is global
    // but the cached settings and medium attributes, which may stay.
}

/// The parameters: name (libfabric makes it `FI_UVIA_<NAME>`), type, help.
const PARAMS: [(&CStr, fi_param_type, &CStr); 7] = [
    (
        c"domain",
        FI_PARAM_STRING,
        c"The one domain listed (unless the hints name another): shm, udp, udp:<interface> or xdp:<interface> (default: every domain, shm first)",
    ),
    (
        c"reliability",
        FI_PARAM_STRING,
        c"Reliability level of endpoints: unreliable, delivery or reception (default: delivery)",
    ),
    (
        c"inject",
        FI_PARAM_STRING,
        c"Faults injected on network domains' receive paths, as loss=0.05,dup=0.01,reorder=0.01,delay=100us,corrupt=0.001,seed=7 (default: UVIA_INJECT, else none)",
    ),
    (
        c"spin_us",
        FI_PARAM_INT,
        c"Microseconds a blocking read spins before it sleeps (default: 20)",
    ),
    (
        c"drive_thread",
        FI_PARAM_BOOL,
        c"A thread per network domain runs the protocol's timers (acknowledgements, retransmissions, keep-alives) between the program's calls, as a NIC would (default: 1; 0: only the program's CQ and EQ reads run them, and a peer waiting for an acknowledgement from a program that stopped calling times out)",
    ),
    (
        c"share_mr",
        FI_PARAM_BOOL,
        c"On shm, the first send or RDMA write longer than 16 KiB from a registered region moves its whole pages (64 KiB to 1 GiB) of private anonymous memory into shared memory at the same addresses, so the peer copies large messages straight out of them; other threads' writes to the pages during the move wait for it (a userfaultfd holds them: root, CAP_SYS_PTRACE or vm.unprivileged_userfaultfd=1, else the memory is left as it is), a forked child then shares those pages rather than copying them, and they stay shared after fi_close (default: 1; 0 leaves registered memory as it is, and large messages are read with process_vm_readv or sent through the ring in pieces)",
    ),
    (
        c"rxm_shm",
        FI_PARAM_BOOL,
        c"Offer the shm domain's connected endpoints to utility providers, so that uvia;ofi_rxm runs on shm too (default: 0: on shm, reliable datagrams are the provider's own FI_EP_RDM endpoints; udp and xdp are offered to ofi_rxm either way)",
    ),
];

fn define_params() {
    for (name, ty, help) in PARAMS {
        // SAFETY: the provider and the strings are static; the help text has
        // no '%', so the variadic format reads no arguments.
        unsafe { fi_param_define(PROVIDER.as_ptr(), name.as_ptr(), ty, help.as_ptr()) };
    }
}

/// What the parameters say.
#[derive(Clone, Debug, Default)]
pub struct Settings {
    /// The one medium listed (`FI_UVIA_DOMAIN`).
    pub domain: Option<String>,
    pub reliability: Option<Reliability>,
    pub inject: Option<String>,
    pub spin: Option<Duration>,
    /// Network domains keep a driver thread (`FI_UVIA_DRIVE_THREAD`).
    pub drive_thread: bool,
    /// Registered memory on shm is moved into shared memory
    /// (`FI_UVIA_SHARE_MR`, see `share`).
    pub share_mr: bool,
    /// The shm domain is offered to utility providers (`FI_UVIA_RXM_SHM`).
    pub rxm_shm: bool,
    /// A setting the provider cannot honour (`FI_UVIA_DOMAIN` names no
    /// domain of this host, `FI_UVIA_INJECT` is no fault spec): said once on
    /// stderr, and no domain is listed, rather than a run on another medium
    /// or without the faults asked for.
    pub refused: bool,
}

/// The settings, read once.
pub fn settings() -> &'static Settings {
    static SETTINGS: OnceLock<Settings> = OnceLock::new();
    SETTINGS.get_or_init(|| {
        let domain = param_str(c"domain");
        let inject = param_str(c"inject");
        let refused = !domain.as_deref().is_none_or(domain_is_known)
            | !inject.as_deref().is_none_or(inject_is_valid);
        Settings {
            domain,
            reliability: param_str(c"reliability").and_then(|s| match s.as_str() {
                "unreliable" => Some(Reliability::Unreliable),
                "delivery" => Some(Reliability::ReliableDelivery),
                "reception" => Some(Reliability::ReliableReception),
                other => {
                    eprintln!(
                        "libfabric:uvia: FI_UVIA_RELIABILITY={other:?} is not unreliable, \
                     delivery or reception; using delivery"
                    );
                    None
                }
            }),
            inject,
            spin: spin_us(),
            drive_thread: param_int(c"drive_thread").is_none_or(|on| on != 0),
            share_mr: param_int(c"share_mr").is_none_or(|on| on != 0),
            rxm_shm: param_int(c"rxm_shm").is_some_and(|on| on != 0),
            refused,
        }
    })
}

/// Whether `FI_UVIA_DOMAIN` names a domain this provider has: `shm`,
/// `udp`, or `udp:` or `xdp:` and an interface of this host; said on
/// stderr if not.
fn domain_is_known(d: &str) -> bool {
    let why = match crate::medium::Medium::parse(d) {
        None => "not shm, udp, udp:<interface> or xdp:<interface>".to_string(),
        Some(m) => match m.interface() {
            Some(i) if !interface_exists(i) => format!("this host has no interface {i:?}"),
            _ => return true,
        },
    };
    eprintln!("libfabric:uvia: FI_UVIA_DOMAIN={d:?}: {why}; no domain listed");
    false
}

/// Whether `FI_UVIA_INJECT` is a fault spec; said on stderr if not.
fn inject_is_valid(spec: &str) -> bool {
    match spec.parse::<uvia_net::inject::FaultSpec>() {
        Ok(_) => true,
        Err(e) => {
            eprintln!("libfabric:uvia: FI_UVIA_INJECT={spec:?}: {e}; no domain listed");
            false
        }
    }
}

fn interface_exists(name: &str) -> bool {
    let Ok(c) = std::ffi::CString::new(name) else {
        return false;
    };
    // SAFETY: a NUL-terminated name.
    unsafe { libc::if_nametoindex(c.as_ptr()) != 0 }
}

/// `FI_UVIA_SPIN_US`, read strictly: libfabric's own reading of an
/// integer takes `12abc` as 12 and `abc` as 0 without a word. At most a
/// second; anything else is said and left to the default.
fn spin_us() -> Option<Duration> {
    const MAX_US: u64 = 1_000_000;
    let v = std::env::var("FI_UVIA_SPIN_US").ok()?;
    match v.trim().parse::<u64>() {
        Ok(us) if us <= MAX_US => Some(Duration::from_micros(us)),
        _ => {
            eprintln!(
                "libfabric:uvia: FI_UVIA_SPIN_US={v:?} is not a number of microseconds up to \
                 {MAX_US}; using the default"
            );
            None
        }
    }
}

fn param_str(name: &CStr) -> Option<String> {
    let mut value: *mut c_char = std::ptr::null_mut();
    // SAFETY: a string parameter's value is written as a char pointer into
    // `value`; libfabric keeps the string (it is the environment's).
    let r = unsafe {
        fi_param_get(
            PROVIDER.as_ptr(),
            name.as_ptr(),
            &mut value as *mut *mut c_char as *mut c_void,
        )
    };
    if r != 0 || value.is_null() {
        return None;
    }
    // SAFETY: non-NULL, NUL-terminated per fi_param_get.
    let s = unsafe { CStr::from_ptr(value) }
        .to_string_lossy()
        .trim()
        .to_string();
    (!s.is_empty()).then_some(s)
}

fn param_int(name: &CStr) -> Option<c_int> {
    let mut value: c_int = 0;
    // SAFETY: an int parameter's value is written as an int.
    let r = unsafe {
        fi_param_get(
            PROVIDER.as_ptr(),
            name.as_ptr(),
            &mut value as *mut c_int as *mut c_void,
        )
    };
    if r != 0 && r != -(FI_ENODATA as c_int) {
        // Set but not a number or a boolean: libfabric says so only at its
        // warning log level, so the provider says it here.
        eprintln!(
            "libfabric:uvia: FI_UVIA_{} is not valid here; using its default",
            name.to_string_lossy().to_uppercase()
        );
    }
    (r == 0).then_some(value)
}
