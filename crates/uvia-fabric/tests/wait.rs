//! Wait objects through the provider's own entry points (as libfabric's
//! inline calls reach them): a CQ opened with `FI_WAIT_FD` hands out an fd
//! with `FI_GETWAIT`; after `fi_trywait` says the program may sleep, the fd
//! is quiet until a peer's message arrives, then readable, and the CQ read
//! finds the receive.

use std::ffi::{c_int, c_void, CStr};
use std::ptr::null_mut;
use uvia_fi::sys::*;

/// Calls an ops table's entry, which the provider always fills.
macro_rules! op {
    ($table:expr, $name:ident ( $($arg:expr),* )) => {
        ((*$table).$name.unwrap())($($arg),*)
    };
}

unsafe fn fid_of<T>(p: *mut T) -> *mut fid {
    p as *mut fid
}

/// Reads EQ events until `want` arrives, within five seconds; returns the
/// CM entry (its `info` for a request).
unsafe fn eq_wait(eq: *mut fid_eq, want: u32) -> fi_eq_cm_entry {
    let mut buf = [0u8; 256];
    for _ in 0..50 {
        let mut event = 0u32;
        let n = op!(
            (*eq).ops,
            sread(
                eq,
                &mut event,
                buf.as_mut_ptr() as *mut c_void,
                buf.len(),
                100,
                0
            )
        );
        if n > 0 && event == want {
            return (buf.as_ptr() as *const fi_eq_cm_entry).read_unaligned();
        }
        assert!(n > 0 || n == -(FI_EAGAIN as isize), "eq read failed: {n}");
    }
    panic!("no event {want} within five seconds");
}

#[test]
fn a_cq_with_an_fd_wait_object_becomes_readable_when_a_message_arrives() {
    unsafe {
        // The shm domain's info for connected endpoints (the reliable
        // datagrams' comes first).
        let mut list: *mut fi_info = null_mut();
        let r = uvia_fi::info::getinfo(
            fi_version(),
            std::ptr::null(),
            std::ptr::null(),
            0,
            std::ptr::null(),
            &mut list,
        );
        assert_eq!(r, 0);
        let mut info = list;
        while !info.is_null()
            && (CStr::from_ptr((*(*info).domain_attr).name).to_bytes() != b"shm"
                || (*(*info).ep_attr).type_ != FI_EP_MSG)
        {
            info = (*info).next;
        }
        assert!(!info.is_null(), "no shm domain listed");

        let mut fab: *mut fid_fabric = null_mut();
        assert_eq!(
            uvia_fi::fabric::open((*info).fabric_attr, &mut fab, null_mut()),
            0
        );
        let mut dom: *mut fid_domain = null_mut();
        assert_eq!(op!((*fab).ops, domain(fab, info, &mut dom, null_mut())), 0);
        let mut eq_attr: fi_eq_attr = std::mem::zeroed();
        eq_attr.wait_obj = FI_WAIT_UNSPEC;
        let mut eq: *mut fid_eq = null_mut();
        assert_eq!(
            op!((*fab).ops, eq_open(fab, &mut eq_attr, &mut eq, null_mut())),
            0
        );

        let mut cq_attr: fi_cq_attr = std::mem::zeroed();
        cq_attr.format = FI_CQ_FORMAT_DATA;
        let mut client_cq: *mut fid_cq = null_mut();
        assert_eq!(
            op!(
                (*dom).ops,
                cq_open(dom, &mut cq_attr, &mut client_cq, null_mut())
            ),
            0
        );
        // Without a wait object there is no fd to hand out.
        let mut fd: c_int = -1;
        let none = op!(
            (*client_cq).fid.ops,
            control(
                fid_of(client_cq),
                FI_GETWAIT as c_int,
                &mut fd as *mut c_int as *mut c_void
            )
        );
        assert_ne!(none, 0);
        cq_attr.wait_obj = FI_WAIT_FD;
        let mut server_cq: *mut fid_cq = null_mut();
        assert_eq!(
            op!(
                (*dom).ops,
                cq_open(dom, &mut cq_attr, &mut server_cq, null_mut())
            ),
            0
        );

        // A listener, and an endpoint that connects to it.
        let mut pep: *mut fid_pep = null_mut();
        assert_eq!(
            op!((*fab).ops, passive_ep(fab, info, &mut pep, null_mut())),
            0
        );
        assert_eq!(op!((*pep).fid.ops, bind(fid_of(pep), fid_of(eq), 0)), 0);
        assert_eq!(op!((*pep).cm, listen(pep)), 0);
        let mut name = [0u8; 128];
        let mut len = name.len();
        assert_eq!(
            op!(
                (*pep).cm,
                getname(fid_of(pep), name.as_mut_ptr() as *mut c_void, &mut len)
            ),
            0
        );

        let endpoint = |info: *mut fi_info, cq: *mut fid_cq| {
            let mut ep: *mut fid_ep = null_mut();
            assert_eq!(op!((*dom).ops, endpoint(dom, info, &mut ep, null_mut())), 0);
            assert_eq!(op!((*ep).fid.ops, bind(fid_of(ep), fid_of(eq), 0)), 0);
            assert_eq!(
                op!(
                    (*ep).fid.ops,
                    bind(fid_of(ep), fid_of(cq), FI_TRANSMIT | FI_RECV)
                ),
                0
            );
            assert_eq!(
                op!(
                    (*ep).fid.ops,
                    control(fid_of(ep), FI_ENABLE as c_int, null_mut())
                ),
                0
            );
            ep
        };
        let client = endpoint(info, client_cq);
        assert_eq!(
            op!(
                (*client).cm,
                connect(client, name.as_ptr() as *const c_void, std::ptr::null(), 0)
            ),
            0
        );
        let req = eq_wait(eq, FI_CONNREQ);
        let server = endpoint(req.info, server_cq);

        // The server's receive buffer, registered (FI_MR_LOCAL).
        let mut buf = [0u8; 64];
        let mut mr: *mut fid_mr = null_mut();
        assert_eq!(
            op!(
                (*dom).mr,
                reg(
                    fid_of(dom),
                    buf.as_mut_ptr() as *const c_void,
                    buf.len(),
                    FI_RECV,
                    0,
                    0,
                    0,
                    &mut mr,
                    null_mut()
                )
            ),
            0
        );
        let ctx = 0x5eed_usize as *mut c_void;
        assert_eq!(
            op!(
                (*server).msg,
                recv(
                    server,
                    buf.as_mut_ptr() as *mut c_void,
                    buf.len(),
                    (*mr).mem_desc,
                    0,
                    ctx
                )
            ),
            0
        );
        assert_eq!(op!((*server).cm, accept(server, std::ptr::null(), 0)), 0);
        eq_wait(eq, FI_CONNECTED);
        eq_wait(eq, FI_CONNECTED);

        // The fd, and leave to sleep on it while nothing came.
        let mut fd: c_int = -1;
        assert_eq!(
            op!(
                (*server_cq).fid.ops,
                control(
                    fid_of(server_cq),
                    FI_GETWAIT as c_int,
                    &mut fd as *mut c_int as *mut c_void
                )
            ),
            0
        );
        assert!(fd >= 0);
        let mut fids = [fid_of(server_cq)];
        assert_eq!(op!((*fab).ops, trywait(fab, fids.as_mut_ptr(), 1)), 0);
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        assert_eq!(libc::poll(&mut p, 1, 0), 0, "readable before anything came");

        // The peer's message wakes it.
        let msg = b"wake up";
        assert_eq!(
            op!(
                (*client).msg,
                inject(client, msg.as_ptr() as *const c_void, msg.len(), 0)
            ),
            0
        );
        assert_eq!(
            libc::poll(&mut p, 1, 5000),
            1,
            "not readable after a message came"
        );
        let mut entry: fi_cq_data_entry = std::mem::zeroed();
        let mut n = 0;
        for _ in 0..1000 {
            n = op!(
                (*server_cq).ops,
                read(server_cq, &mut entry as *mut _ as *mut c_void, 1)
            );
            if n != -(FI_EAGAIN as isize) {
                break;
            }
        }
        assert_eq!(n, 1);
        assert_eq!(entry.op_context, ctx);
        assert_eq!(entry.len, msg.len());
        assert_eq!(&buf[..msg.len()], msg);
        // Nothing left: it may sleep again.
        assert_eq!(op!((*fab).ops, trywait(fab, fids.as_mut_ptr(), 1)), 0);

        for f in [
            fid_of(client),
            fid_of(server),
            fid_of(mr),
            fid_of(pep),
            fid_of(client_cq),
            fid_of(server_cq),
            fid_of(eq),
            fid_of(dom),
            fid_of(fab),
        ] {
            assert_eq!(op!((*f).ops, close(f)), 0);
        }
        fi_freeinfo(list);
        fi_freeinfo(req.info);
    }
}

fn fi_version() -> u32 {
    (1 << 16) | 17
}
