const s=require('net').connect(40277,'127.0.0.1',()=>s.end()); s.on('error',e=>console.log(e.message));
