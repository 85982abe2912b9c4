//! The checkpoints a message passes, in the order it passes them.

/// A point on a message's path. The sender's checkpoints come first, then
/// the receiver's; each provider marks the ones its path has (a kernel
/// socket has no protocol engine in user space, shared memory no system
/// call).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u16)]
pub enum Stage {
    /// The application hands a message over (calls post-send, or is about
    /// to call send on a socket).
    AppSend = 1,
    /// The VI layer has checked the descriptor and queued it.
    ViPosted,
    /// The protocol engine has built the message's frame(s), payload
    /// copied in.
    ProtoBuilt,
    /// The medium has the frame in its transmit ring or buffer.
    MediumQueued,
    /// A system call that transmits is about to be made.
    SyscallEnter,
    /// That system call has returned.
    SyscallExit,
    /// Post-send (or send) returns to the application.
    AppSendReturned,
    /// A poll of the medium found the message (or a socket receive
    /// returned it).
    RxFound,
    /// The frame has been found its VI and handed to the protocol engine.
    ProtoIn,
    /// The engine has placed the payload in the receive buffer.
    ProtoPlaced,
    /// The receive descriptor is complete.
    ViCompleted,
    /// The application has the message (its done or wait call returns it).
    AppReceived,
    /// The application has read its clock: a ping-pong's client, at the
    /// start and end of the round trip it times.
    AppClock,
}

impl Stage {
    pub const ALL: [Stage; 13] = [
        Stage::AppSend,
        Stage::ViPosted,
        Stage::ProtoBuilt,
        Stage::MediumQueued,
        Stage::SyscallEnter,
        Stage::SyscallExit,
        Stage::AppSendReturned,
        Stage::RxFound,
        Stage::ProtoIn,
        Stage::ProtoPlaced,
        Stage::ViCompleted,
        Stage::AppReceived,
        Stage::AppClock,
    ];

    /// A short name, as tables print it.
    pub fn name(self) -> &'static str {
        match self {
            Stage::AppSend => "app-send",
            Stage::ViPosted => "vi-posted",
            Stage::ProtoBuilt => "proto-built",
            Stage::MediumQueued => "medium-queued",
            Stage::SyscallEnter => "syscall-enter",
            Stage::SyscallExit => "syscall-exit",
            Stage::AppSendReturned => "app-send-returned",
            Stage::RxFound => "rx-found",
            Stage::ProtoIn => "proto-in",
            Stage::ProtoPlaced => "proto-placed",
            Stage::ViCompleted => "vi-completed",
            Stage::AppReceived => "app-received",
            Stage::AppClock => "app-clock",
        }
    }

    /// Whether the sender passes this point (else the receiver does).
    pub fn is_send(self) -> bool {
        self <= Stage::AppSendReturned
    }

    pub fn from_u16(v: u16) -> Option<Stage> {
        Stage::ALL.iter().copied().find(|s| *s as u16 == v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_names_are_distinct() {
        let mut names = std::collections::HashSet::new();
        for s in Stage::ALL {
            assert_eq!(Stage::from_u16(s as u16), Some(s));
            assert!(names.insert(s.name()), "{}", s.name());
        }
        assert_eq!(Stage::from_u16(0), None);
        assert_eq!(Stage::from_u16(Stage::ALL.len() as u16 + 1), None);
        assert!(Stage::AppSendReturned.is_send() && !Stage::RxFound.is_send());
    }
}
