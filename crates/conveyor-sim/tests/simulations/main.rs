//! The simulations `cargo test` runs, in one test binary (one link instead of six): the core path's
//! fixed seeds and every seed that once failed (`seeds`), and each capability's own simulation. Run
//! one with a filter: `cargo test -p conveyor-sim --test simulations timers::`.

mod claims;
mod delays;
mod flows;
mod outbox;
mod schedule;
mod seeds;
mod tenants;
mod timers;
