export * from './codec.js';
export * from './client.js';
export * from './sessions.js';
export * from './store.js';
