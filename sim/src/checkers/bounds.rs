//! No output queue grows past its bound, and the kernel's count of queued
//! bytes is exactly what the world was handed and did not report written
//! (a pair assertion across the kernel boundary).

use super::{Check, Violation};
use crate::world::World;

/// Checks every connection the kernel still tracks.
pub fn check(world: &World) -> Check {
    let max = world.server.config().limits.max_output_bytes_per_connection;
    for conn in world.kernel_conns() {
        let queued = world.server.queued_bytes(conn);
        if queued > max {
            let message = format!("{conn}: {queued} bytes queued, bound {max}");
            return Err(Violation::new("bounds", message));
        }
        let unwritten = world.unwritten(conn);
        if queued != unwritten {
            let message = format!("{conn}: kernel counts {queued} queued bytes, world {unwritten}");
            return Err(Violation::new("bounds", message));
        }
    }
    Ok(())
}
