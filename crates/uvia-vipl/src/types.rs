//! The C types of `vipl.h`, field for field. The layout tests at the bottom
//! pin the offsets a C compiler gives the header on 64-bit Linux.

use std::ffi::{c_char, c_int, c_ulong, c_void};
use uvia::Descriptor;

pub type VipReturn = c_int;
pub type VipBoolean = c_int;

/// `VIP_RETURN` codes, in the header's order.
pub mod ret {
    use super::VipReturn;
    pub const SUCCESS: VipReturn = 0;
    pub const NOT_DONE: VipReturn = 1;
    pub const INVALID_PARAMETER: VipReturn = 2;
    pub const ERROR_RESOURCE: VipReturn = 3;
    pub const TIMEOUT: VipReturn = 4;
    pub const REJECT: VipReturn = 5;
    pub const INVALID_RELIABILITY_LEVEL: VipReturn = 6;
    pub const INVALID_MTU: VipReturn = 7;
    pub const INVALID_QOS: VipReturn = 8;
    pub const INVALID_PTAG: VipReturn = 9;
    pub const INVALID_RDMAREAD: VipReturn = 10;
    pub const DESCRIPTOR_ERROR: VipReturn = 11;
    pub const INVALID_STATE: VipReturn = 12;
    pub const ERROR_NAMESERVICE: VipReturn = 13;
    pub const NO_MATCH: VipReturn = 14;
    pub const NOT_REACHABLE: VipReturn = 15;
    pub const ERROR_NOT_SUPPORTED: VipReturn = 16;
}

/// `VIP_SERVICE_*` reliability bits.
pub mod service {
    pub const UNRELIABLE: u16 = 0x01;
    pub const RELIABLE_DELIVERY: u16 = 0x02;
    pub const RELIABLE_RECEPTION: u16 = 0x04;
}

/// `VIP_VI_STATE`.
pub mod state {
    use std::ffi::c_int;
    pub const IDLE: c_int = 0;
    pub const CONNECTED: c_int = 1;
    pub const CONNECT_PENDING: c_int = 2;
    pub const ERROR: c_int = 3;
}

/// `VIP_ERROR_CODE` and `VIP_RESOURCE_CODE` values the library reports.
pub mod async_error {
    use std::ffi::c_int;
    pub const POST_DESC: c_int = 0;
    pub const CONN_LOST: c_int = 1;
    pub const RESOURCE_VI: c_int = 1;
    pub const RESOURCE_DESCRIPTOR: c_int = 3;
}

/// `VIPL_HOST_ADDRESS_LEN`: the longest host address (an IPv6 udp
/// address); the others are 6 bytes ([`crate::address`]).
pub const HOST_ADDRESS_LEN: usize = crate::address::MAX_LEN;
/// `VIP_INFINITE`, and the 32-bit value older programs pass for it.
pub const INFINITE: c_ulong = !0;
pub const INFINITE32: c_ulong = 0xffff_ffff;
pub const SMI_AUTODISCOVERY: c_ulong = 1;

/// `VIP_NET_ADDRESS`: two lengths, then host address and discriminator bytes.
#[repr(C)]
pub struct NetAddress {
    pub host_address_len: u16,
    pub discriminator_len: u16,
    pub host_address: [u8; 1],
}

#[repr(C)]
pub struct NicAttributes {
    pub name: [c_char; 64],
    pub hardware_version: c_ulong,
    pub provider_version: c_ulong,
    pub nic_address_len: u16,
    pub local_nic_address: *const u8,
    pub thread_safe: VipBoolean,
    pub max_discriminator_len: u16,
    pub max_register_bytes: c_ulong,
    pub max_register_regions: c_ulong,
    pub max_register_block_bytes: c_ulong,
    pub max_vi: c_ulong,
    pub max_descriptors_per_queue: c_ulong,
    pub max_segments_per_desc: c_ulong,
    pub max_cq: c_ulong,
    pub max_cq_entries: c_ulong,
    pub max_transfer_size: c_ulong,
    pub native_mtu: c_ulong,
    pub max_ptags: c_ulong,
    pub reliability_level_support: u16,
    pub rdma_read_support: u16,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ViAttributes {
    pub reliability_level: u16,
    pub max_transfer_size: c_ulong,
    pub qos: *mut c_void,
    pub ptag: *mut c_void,
    pub enable_rdma_write: VipBoolean,
    pub enable_rdma_read: VipBoolean,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct MemAttributes {
    pub ptag: *mut c_void,
    pub enable_rdma_write: VipBoolean,
    pub enable_rdma_read: VipBoolean,
}

#[repr(C)]
pub struct ErrorDescriptor {
    pub nic_handle: *mut c_void,
    pub vi_handle: *mut c_void,
    pub cq_handle: *mut c_void,
    pub descriptor_ptr: *mut Descriptor,
    pub op_code: c_ulong,
    pub resource_code: c_int,
    pub error_code: c_int,
}

#[repr(C)]
pub struct AutodiscoveryList {
    pub number_of_hops: c_ulong,
    pub ad_addr_array: *mut *mut NetAddress,
    pub num_ad_addrs: c_ulong,
}

pub type ViNotifyHandler =
    Option<unsafe extern "C" fn(*mut c_void, *mut c_void, *mut c_void, *mut Descriptor)>;
pub type CqNotifyHandler =
    Option<unsafe extern "C" fn(*mut c_void, *mut c_void, *mut c_void, VipBoolean)>;
pub type ErrorHandler = Option<unsafe extern "C" fn(*mut c_void, *mut ErrorDescriptor)>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn layouts_match_the_header_on_lp64() {
        assert_eq!(offset_of!(NetAddress, host_address), 4);
        assert_eq!(offset_of!(NicAttributes, hardware_version), 64);
        assert_eq!(offset_of!(NicAttributes, nic_address_len), 80);
        assert_eq!(offset_of!(NicAttributes, local_nic_address), 88);
        assert_eq!(offset_of!(NicAttributes, thread_safe), 96);
        assert_eq!(offset_of!(NicAttributes, max_discriminator_len), 100);
        assert_eq!(offset_of!(NicAttributes, max_register_bytes), 104);
        assert_eq!(offset_of!(NicAttributes, max_ptags), 184);
        assert_eq!(offset_of!(NicAttributes, reliability_level_support), 192);
        assert_eq!(size_of::<NicAttributes>(), 200);
        assert_eq!(offset_of!(ViAttributes, max_transfer_size), 8);
        assert_eq!(offset_of!(ViAttributes, ptag), 24);
        assert_eq!(size_of::<ViAttributes>(), 40);
        assert_eq!(size_of::<MemAttributes>(), 16);
        assert_eq!(offset_of!(ErrorDescriptor, op_code), 32);
        assert_eq!(size_of::<ErrorDescriptor>(), 48);
        assert_eq!(size_of::<Descriptor>(), 128);
    }
}
